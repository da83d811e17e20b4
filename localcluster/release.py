"""``python -m localcluster.release [--dist DIR] [--image NAME]`` (``make release``).

Writes the release's manifests, versioned with the package (pyproject.toml), with the tools
``localcluster build`` pins:

- ``install.yaml``: deploy/ in one file (``kustomize build``: CRDs, namespace, RBAC,
  Deployments, Services, webhook configurations), its image tagged with the version;
- ``crds-v1beta2.yaml``: the CRDs with AppWrapper v1beta2 served beside v1beta1 and
  converted by the dispatcher's webhook (deploy/v1beta2), to apply once it runs;
- ``dispatcher-VERSION.tgz``: the Helm chart (charts/dispatcher), packaged with the version
  as its version and appVersion; its links to deploy/ become copies.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

from . import build

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CHART = REPO / "charts" / "dispatcher"
#: The image name deploy/ and the chart use unless told another.
IMAGE = "dispatcher"


class ReleaseError(RuntimeError):
    pass


def package_version() -> str:
    pyproject = REPO / "pyproject.toml"
    if not pyproject.is_file():
        raise ReleaseError(f"{pyproject} not found: release from a checkout of the repository")
    version: str = tomllib.loads(pyproject.read_text())["project"]["version"]
    return version


def _run(*argv: str | Path) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, argv))} exited {done.returncode}: "
                           f"{done.stderr.strip()}")
    return done.stdout


def install_yaml(version: str, image: str = IMAGE) -> str:
    """deploy/ as one manifest, running ``image:version``."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY, tmp)],
            "images": [{"name": IMAGE, "newName": image, "newTag": version}]}))
        rendered = _run(build.binary("kustomize"), "build", tmp)
    return (f"# dispatcher {version}: kubectl apply --server-side -f install.yaml\n"
            "# (docs/operations.md, \"Install on a cluster\")\n" + rendered)


def v1beta2_crds() -> str:
    """deploy/v1beta2: the CRDs serving AppWrapper v1beta2 too."""
    rendered = _run(build.binary("kustomize"), "build", DEPLOY / "v1beta2")
    return ("# AppWrapper v1beta2 beside v1beta1, once the dispatcher's webhook runs:\n"
            "#   kubectl apply --server-side --force-conflicts -f crds-v1beta2.yaml\n"
            "# (docs/guide/v1beta2.md)\n" + rendered)


def package_chart(dist: Path, version: str) -> Path:
    _run(build.binary("helm"), "package", CHART, "--destination", dist,
         "--version", version, "--app-version", version)
    return dist / f"dispatcher-{version}.tgz"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.release",
                                 description="Write install.yaml, crds-v1beta2.yaml and the "
                                 "packaged Helm chart.")
    ap.add_argument("--dist", type=Path, default=REPO / "dist", help="default: dist/")
    ap.add_argument("--image", default=IMAGE,
                    help=f"the image, without its tag (default {IMAGE}; the tag is the version)")
    args = ap.parse_args(argv)
    try:
        version = package_version()
        args.dist.mkdir(parents=True, exist_ok=True)
        (args.dist / "install.yaml").write_text(install_yaml(version, args.image))
        (args.dist / "crds-v1beta2.yaml").write_text(v1beta2_crds())
        chart = package_chart(args.dist, version)
    except (ReleaseError, build.BuildError) as exc:
        print(f"release: error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.dist / 'install.yaml'}\n{args.dist / 'crds-v1beta2.yaml'}\n{chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
