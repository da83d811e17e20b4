"""``python -m localcluster build|up|down|status|env|pin|profile|image``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import build, config, dockerfile, image, image_build, profiles
from .cluster import Cluster, ClusterError
from .node import NodeError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m localcluster",
        description="A local Kubernetes control plane with fake GPU nodes (kwok).",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) the binaries in the cache")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("only", nargs="*", help="wrapper modules to build (default: all)")
    u = sub.add_parser("up", help="start the cluster (reuses a healthy running one)")
    u.add_argument("--profile", default=config.DEFAULT_PROFILE,
                   help=f"node profile ({', '.join(profiles.available())}) or a YAML path")
    u.add_argument("--no-operators", action="store_true",
                   help="do not run the operators (KubeRay, training, MXJob, JobSet)")
    u.add_argument("--fresh", action="store_true", help="recreate even if running")
    u.add_argument("--real-node", action="store_true",
                   help="also a node that runs containers (kubelet, containerd, runc; root)")
    u.add_argument("--timeout", type=float, default=180)
    sub.add_parser("down", help="stop the cluster and remove its state")
    sub.add_parser("status", help="print the cluster's state as JSON")
    sub.add_parser("env", help="print shell exports (eval \"$(python -m localcluster env)\")")
    p = sub.add_parser("profile", help="replace the fake nodes with another profile")
    p.add_argument("name")
    pin = sub.add_parser("pin", help="regenerate go.mod/go.sum from versions.py")
    pin.add_argument("only", nargs="*")
    i = sub.add_parser("image", help="build the dispatcher's image as an OCI image archive, "
                       "with no container engine (needs root)")
    i.add_argument("--out",
                   help="copy the archive here (a file, or a folder ending in /)")
    i.add_argument("--fresh", action="store_true",
                   help="build every step again, e.g. for Debian's security updates")
    i.add_argument("--dockerfile", action="store_true",
                   help="print the Dockerfile of the same image instead")
    return ap


def _image(args: argparse.Namespace) -> None:
    if args.dockerfile:
        print(dockerfile.render(image.describe()), end="")
        return
    built = image_build.build_image(args.out, fresh=args.fresh)
    how = "found in the cache" if built.reused else "built"
    print(f"{built.path} ({built.size / 1e6:.1f} MB; {how} in {built.seconds:.1f}s)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "build":
            start = time.monotonic()
            build.build_all(args.only or None, force=args.force)
            print(f"binaries ready in {config.bin_root()} ({time.monotonic() - start:.1f}s)")
        elif args.cmd == "up":
            Cluster().up(profile=args.profile, operators=not args.no_operators,
                         reuse=not args.fresh, timeout=args.timeout,
                         real_node=args.real_node)
        elif args.cmd == "down":
            Cluster().down()
        elif args.cmd == "status":
            st = Cluster().status()
            print(json.dumps(st, indent=2))
            return 0 if st["apiserver_ready"] else 1
        elif args.cmd == "env":
            print(Cluster().env_script(), end="")
        elif args.cmd == "profile":
            print("\n".join(Cluster().use_profile(args.name)))
        elif args.cmd == "pin":
            build.pin(args.only or None)
        elif args.cmd == "image":
            _image(args)
    except (build.BuildError, ClusterError, image_build.ImageError, NodeError, TimeoutError,
            FileNotFoundError) as exc:
        print(f"localcluster {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    return 0
