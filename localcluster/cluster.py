"""Start, check and stop the local control plane.

kwokctl (``--runtime binary``) runs etcd, kube-apiserver (TLS, RBAC, admission),
kube-controller-manager, kube-scheduler and the kwok controller from the binaries built by
``localcluster.build``; it writes the certificates, the kubeconfig and one log file per
component into the cluster directory. On top of that this module installs the pod/node
Stage resources, the fake nodes of a profile, the upstream CRDs, and runs the KubeRay
operator, the Kubeflow training operator (v1.9, and v1.8's for MXJob) and the JobSet
controller as local processes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import build, config, node, node_images, ports, profiles, users, versions
from .jobset import JOBSET
from .kube import Kubectl, KubectlError, answers, wait_for
from .lws import LWS
from .procs import alive, runs_in, spawn, tail

TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_WEBHOOK_SECRET = "training-operator-webhook-cert"
# The training operator's cert rotator and webhook server both read this directory (in a
# Deployment the Secret is mounted there); we play the kubelet and write the Secret's files.
TRAINING_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
READY_FILE = "dispatcher-ready.json"
STOPPED_FILE = "stopped-components.json"


class ClusterError(RuntimeError):
    pass


_T0 = time.monotonic()


def _say(msg: str) -> None:
    # Seconds since start, so a slow step of `up` shows itself.
    print(f"[localcluster +{time.monotonic() - _T0:5.1f}s] {msg}", file=sys.stderr, flush=True)


@dataclass
class Operator:
    """A controller process we run next to the control plane."""

    name: str
    wrapper: str
    binary: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    probe_port: int = 0
    #: Started only once the training operators' shared Secret holds certificates.
    after_training_certs: bool = False


@dataclass
class Cluster:
    """A handle on the (possibly not yet running) local cluster called ``name``."""

    name: str = field(default_factory=config.cluster_name)

    # ------------------------------------------------------------------ paths
    @property
    def dir(self) -> Path:
        return config.cluster_dir(self.name)

    @property
    def kubeconfig(self) -> Path:
        return config.kubeconfig_path(self.name)

    @property
    def logs(self) -> Path:
        return config.logs_dir(self.name)

    @property
    def pids(self) -> Path:
        return self.dir / "dispatcher-pids"

    def kubectl(self, namespace: str | None = None) -> Kubectl:
        return Kubectl(build.binary("kubernetes", "kubectl"), self.kubeconfig, namespace)

    def log_hint(self) -> str:
        return (f"component logs: {self.logs}/ (kwokctl.log, etcd.log, kube-apiserver.log, "
                f"kube-controller-manager.log, kube-scheduler.log, kwok-controller.log, "
                f"crds.log, kuberay-operator.log, training-operator.log, "
                f"mxjob-operator.log, jobset-controller.log, lws-controller.log)")

    # ------------------------------------------------------------------ state
    def ready_info(self) -> dict[str, Any] | None:
        p = self.dir / READY_FILE
        if not p.exists():
            return None
        try:
            data: dict[str, Any] = json.loads(p.read_text())
        except ValueError:
            return None
        return data

    def apiserver_ready(self) -> bool:
        if not self.kubeconfig.exists():
            return False
        try:
            out = self.kubectl()("get", "--raw=/readyz", timeout=10)
        except (KubectlError, subprocess.TimeoutExpired, build.BuildError):
            return False
        return out.strip() == "ok"

    def operator_pids(self) -> dict[str, int]:
        """The operators we started (``dispatcher-pids/``)."""
        return _read_pids(self.pids)

    def component_pids(self) -> dict[str, int]:
        """The processes kwokctl started (its ``pids/``): etcd, kube-*, kwok-controller."""
        return _read_pids(self.dir / "pids")

    def processes(self) -> dict[str, bool]:
        """Every process of the cluster -> whether it is running."""
        procs = {**self.component_pids(), **self.operator_pids()}
        return {name: runs_in(pid, self.dir) for name, pid in sorted(procs.items())}

    def is_running(self, real_node: bool | None = None) -> bool:
        """Up, healthy, fully set up by this code, and built from the current binaries;
        with a real node or without one (None: either)."""
        info = self.ready_info()
        if real_node is None:
            real_node = bool(info and info.get("real_node"))
        if info is None or info.get("build") != _build_ids() \
                or info.get("components") != _component_patches(self.dir, real_node):
            return False
        # A dead scheduler or kwok would not show in /readyz but would break every test.
        procs = self.processes()
        if not procs or not all(procs.values()):
            return False
        return self.apiserver_ready()

    # ------------------------------------------------------------------ up
    def up(self, profile: str = config.DEFAULT_PROFILE, operators: bool = True,
           reuse: bool = True, timeout: float = 180, real_node: bool = False) -> None:
        """Start the cluster (or reuse a healthy one) and wait until it is ready; with
        `real_node`, also a node that runs containers (localcluster/node.py)."""
        start = time.monotonic()
        bins = _binaries()
        if real_node and (problems := node.missing()):
            raise ClusterError("cannot start a real node: " + "; ".join(problems))
        if reuse and self.is_running(real_node or None):
            # Reuse is what makes a second `up` (or a second test run) take a second; only
            # the fake nodes may differ from what this caller wants.
            if (self.ready_info() or {}).get("profile") != profile:
                self.use_profile(profile, timeout)
            info = self.ready_info() or {}
            if operators and not info.get("operators"):
                # Started without them (the e2e bench does): whoever wants them now gets them.
                info["operators"] = self._start_operators(self.kubectl(), timeout)
                (self.dir / READY_FILE).write_text(json.dumps(info, indent=2) + "\n")
            users.ensure(self.dir, self.kubectl())  # a cluster from before users existed
            self._apply_stages(self.kubectl())  # pod outcomes added since it started
            _say(f"cluster {self.name!r} is already running")
            self.print_usage()
            return
        if self.dir.exists():
            _say(f"removing stale state of cluster {self.name!r}")
            self.down(quiet=True)
        try:
            self._create(bins, timeout, real_node)
            kubectl = self.kubectl()
            # The CRDs are 8 MB of OpenAPI schema that the API server chews on for a while:
            # let it do that while kwok's stages and the fake nodes are set up.
            crds = self._start_crd_install(kubectl)
            self._apply_stages(kubectl)
            names = profiles.apply(kubectl, profile, timeout=timeout)
            _say(f"{len(names)} fake nodes Ready (profile {profile!r})")
            self._finish_crd_install(kubectl, crds, timeout)
            self._wait_default_serviceaccount(kubectl, "default", timeout)
            users.ensure(self.dir, kubectl)
            ops = self._start_operators(kubectl, timeout) if operators else []
            if real_node:
                users.enforce_pod_security(kubectl, "baseline")
                self.real_node().start(timeout=timeout)
                _say(f"real node {node.NAME!r} Ready")
        except Exception as exc:
            raise ClusterError(f"the local cluster did not start: {exc}\n{self.log_hint()}"
                               ) from exc
        info = {
            "name": self.name,
            "kubeconfig": str(self.kubeconfig),
            "kubectl": str(bins["kubectl"]),
            "profile": profile,
            "operators": ops,
            "build": _build_ids(),
            "components": _component_patches(self.dir, real_node),
            "real_node": real_node,
            "started_seconds": round(time.monotonic() - start, 1),
        }
        (self.dir / READY_FILE).write_text(json.dumps(info, indent=2) + "\n")
        (self.dir / "env.sh").write_text(self.env_script())
        _say(f"cluster {self.name!r} ready in {time.monotonic() - start:.1f}s")
        self.print_usage()

    def use_profile(self, profile: str, timeout: float = 60) -> list[str]:
        """Replace the fake nodes of the running cluster with those of ``profile``."""
        names = profiles.apply(self.kubectl(), profile, timeout=timeout)
        _say(f"{len(names)} fake nodes Ready (profile {profile!r})")
        info = self.ready_info()
        if info is not None:
            info["profile"] = profile
            (self.dir / READY_FILE).write_text(json.dumps(info, indent=2) + "\n")
        return names

    def _create(self, bins: dict[str, Path], timeout: float, real_node: bool) -> None:
        config.state_root().mkdir(parents=True, exist_ok=True)
        cfg = config.state_root() / f"{self.name}-kwokctl.yaml"
        cfg.write_text(yaml.safe_dump(_kwokctl_config(bins, ports.block_of(self.name),
                                                      self.dir, real_node)))
        cmd = [str(bins["kwokctl"]), "create", "cluster", "--name", self.name,
               "--config", str(cfg), "--kubeconfig", "", "--timeout", f"{int(timeout)}s"]
        _say(f"starting control plane {self.name!r} with kwokctl (state: {self.dir})")
        proc = subprocess.run(cmd, env=_kwok_env(), capture_output=True, text=True,
                              timeout=timeout + 30)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / "kwokctl.log").write_text(
            f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        if proc.returncode != 0:
            end = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
            raise ClusterError(f"kwokctl create cluster failed (exit {proc.returncode}):\n{end}")
        wait_for(self.apiserver_ready, timeout, "kube-apiserver /readyz")
        self.start_exited(timeout)

    def start_exited(self, timeout: float = 180) -> None:
        """Start again the components that exited while kube-apiserver was starting.

        kwokctl starts them all at once without waiting for the API server, and
        kwok-controller gives up for good when it cannot list nodes within five tries
        (1+2+4+8 s: kwok's waitForReady): on a loaded machine, where kube-apiserver took
        longer, it had exited and no fake node was ever marked Ready. `kwokctl start
        cluster` starts only what is not running; the API server answers by now."""
        exited = [n for n, pid in self.component_pids().items() if not runs_in(pid, self.dir)]
        if not exited:
            return
        for name in exited:
            _say(f"{name} exited while kube-apiserver was starting: starting it again; "
                 f"its log ended with:\n{tail(self.logs / f'{name}.log', 5)}")
            # kwokctl takes a pid that answers signal 0 for a running component, and an
            # exited one nobody reaped (a zombie) does: without its pid file, it starts it.
            (self.dir / "pids" / f"{name}.pid").unlink(missing_ok=True)
        cmd = [str(_binaries()["kwokctl"]), "start", "cluster", "--name", self.name,
               "--timeout", f"{int(timeout)}s"]
        proc = subprocess.run(cmd, env=_kwok_env(), capture_output=True, text=True,
                              timeout=timeout + 30)
        still = [n for n, pid in self.component_pids().items() if not runs_in(pid, self.dir)]
        if proc.returncode != 0 or still:
            raise ClusterError(f"{', '.join(still or exited)} could not be started again "
                               f"(kwokctl start cluster exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr).strip()[-2000:]}")

    def _apply_stages(self, kubectl: Kubectl) -> None:
        wait_for(lambda: _crd_established(kubectl, "stages.kwok.x-k8s.io"), 60,
                 "the kwok Stage CRD")
        kwok_dir = Path(build.module_dirs("kwok")["sigs.k8s.io/kwok"])
        docs = [
            (kwok_dir / "kustomize/stage/node/fast/node-initialize.yaml").read_text(),
            (kwok_dir / "kustomize/stage/node/heartbeat-with-lease/"
             "node-heartbeat-with-lease.yaml").read_text(),
            (config.STAGES_DIR / "pods.yaml").read_text(),
        ]
        kubectl.apply("\n---\n".join(docs))

    def _start_crd_install(self, kubectl: Kubectl) -> subprocess.Popen[bytes]:
        # `create`, not `apply`: the cluster is new, and the RayCluster CRD is too large for
        # client-side apply's last-applied annotation anyway.
        args = [a for f in crd_files() for a in ("-f", str(f))]
        with (self.logs / "crds.log").open("wb") as log:
            return subprocess.Popen(kubectl.command("create", *args), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _finish_crd_install(self, kubectl: Kubectl, proc: subprocess.Popen[bytes],
                            timeout: float) -> None:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            raise ClusterError(f"installing the CRDs failed (exit {rc}):\n"
                               f"{tail(self.logs / 'crds.log')}")
        names = [crd_name(f) for f in crd_files()]
        kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s",
                *(f"crd/{n}" for n in names), timeout=timeout + 10)
        _say(f"{len(names)} CRDs established")

    def _wait_default_serviceaccount(self, kubectl: Kubectl, ns: str, timeout: float) -> None:
        wait_for(lambda: kubectl.run("get", "serviceaccount", "default", "-n", ns,
                                     check=False).returncode == 0,
                 timeout, f"service account default in namespace {ns}")

    # ------------------------------------------------------------------ operators
    def _operators(self) -> list[Operator]:
        kc = str(self.kubeconfig)
        block = ports.block_of(self.name)
        kuberay_probe, training_probe, mxjob_probe, jobset_probe, lws_probe = (
            block.port(f"{op}-probe")
            for op in ("kuberay", "training", "mxjob", "jobset", "lws"))
        return [
            Operator(
                "kuberay-operator", "kuberay", "ray-operator",
                ["--kubeconfig", kc, "--metrics-addr", "0",
                 "--health-probe-bind-address", f"127.0.0.1:{kuberay_probe}",
                 "--enable-leader-election=false", "--log-stdout-encoder", "console"],
                probe_port=kuberay_probe,
            ),
            Operator(
                "training-operator", "training-operator", "training-operator.v1",
                _training_args(kc, training_probe, block.port("training-webhook"), self.dir),
                env=_TRAINING_ENV,
                probe_port=training_probe,
            ),
            # v1.9 dropped MXJob; v1.8.1 runs it, and only it. It shares v1.9's webhook
            # Secret and certificate directory (same service name, CA name and hard-coded
            # directory), so it starts once they hold v1.9's certificates, finds them valid,
            # and keeps them rather than rotating them under v1.9's feet.
            Operator(
                "mxjob-operator", "mxjob-operator", "training-operator.v1",
                [*_training_args(kc, mxjob_probe, block.port("mxjob-webhook"), self.dir),
                 "--enable-scheme=mxjob"],
                env=_TRAINING_ENV, probe_port=mxjob_probe, after_training_certs=True,
            ),
            Operator(
                JOBSET.name, "jobset", "jobset",
                JOBSET.arguments(self.dir, self.kubeconfig, jobset_probe,
                                 block.port("jobset-webhook")),
                probe_port=jobset_probe,
            ),
            Operator(
                LWS.name, "lws", "cmd",
                LWS.arguments(self.dir, self.kubeconfig, lws_probe, block.port("lws-webhook")),
                probe_port=lws_probe,
            ),
        ]

    def _start_operators(self, kubectl: Kubectl, timeout: float) -> list[str]:
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": TRAINING_OPERATOR_NAMESPACE}})
        # The training operator's cert rotator fills this Secret; it must exist first.
        kubectl.in_namespace(TRAINING_OPERATOR_NAMESPACE).apply({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": TRAINING_WEBHOOK_SECRET,
                         "namespace": TRAINING_OPERATOR_NAMESPACE}})
        # Certificates left by an earlier cluster would be taken as already "mounted" and
        # served although the new Secret holds other ones.
        shutil.rmtree(TRAINING_CERT_DIR, ignore_errors=True)
        (self.dir / PYTORCH_INIT_FILE).write_text(PYTORCH_INIT_CONTAINER)
        ops = self._operators()
        for op in ops:
            if not op.after_training_certs:
                self._spawn(op)
        self._mount_training_certs(kubectl, timeout)
        for op in ops:
            if op.after_training_certs:
                self._spawn(op)
        for op in ops:
            self._wait_operator(op, timeout)
        JOBSET.register_webhooks(kubectl, self.dir)
        LWS.register_webhooks(kubectl, self.dir)
        _say("operators ready: " + ", ".join(op.name for op in ops))
        return [op.name for op in ops]

    def start_operator(self, name: str, timeout: float = 180) -> None:
        """One operator of a cluster started without them (e.g. the kuberay operator for
        a bench's RayClusters), unless it runs; not one that needs the training operator's
        certificates."""
        (op,) = [o for o in self._operators() if o.name == name]
        assert not op.after_training_certs, name
        if runs_in(self.operator_pids().get(name, 0), self.dir):
            return
        self._spawn(op)
        self._wait_operator(op, timeout)

    def real_node(self) -> node.RealNode:
        """The cluster's real node (started by ``up(real_node=True)``)."""
        return node.RealNode(
            self.dir, self.real_node_ports(),
            node.Binaries(build.binary("kubernetes", "kubelet"),
                          build.binary("kubernetes", "kube-proxy"), build.binary("coredns")),
            self.kubectl())

    def real_node_ports(self) -> node.Ports:
        block = ports.block_of(self.name)
        return node.Ports(*(block.port(r) for r in (
            "kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics",
            "dns-health", "dns-ready")))

    def _spawn(self, op: Operator) -> None:
        exe = build.binary(op.wrapper, op.binary)
        spawn([str(exe), *op.args], self.logs / f"{op.name}.log", self.pids / f"{op.name}.pid",
              self.dir, env={**os.environ, "KUBECONFIG": str(self.kubeconfig), **op.env})

    def _mount_training_certs(self, kubectl: Kubectl, timeout: float) -> None:
        k = kubectl.in_namespace(TRAINING_OPERATOR_NAMESPACE)

        def secret_data() -> dict[str, str] | None:
            data: dict[str, str] = k.json("secret", TRAINING_WEBHOOK_SECRET).get("data") or {}
            return data if data.get("tls.crt") and data.get("tls.key") else None

        data = wait_for(secret_data, timeout,
                        f"the training operator to fill Secret {TRAINING_WEBHOOK_SECRET}")
        TRAINING_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            if key in data:
                tmp = TRAINING_CERT_DIR / f".{key}.tmp"
                tmp.write_bytes(base64.b64decode(data[key]))
                tmp.rename(TRAINING_CERT_DIR / key)

    def _wait_operator(self, op: Operator, timeout: float) -> None:
        pid = self.operator_pids()[op.name]
        url = f"http://127.0.0.1:{op.probe_port}/readyz"

        def ready() -> bool:
            if not alive(pid):
                end = tail(self.logs / f"{op.name}.log")
                raise ClusterError(f"{op.name} exited; log {self.logs / (op.name + '.log')}:"
                                   f"\n{end}")
            return answers(url)

        wait_for(ready, timeout, f"{op.name} to be ready ({url}); log: "
                                 f"{self.logs / (op.name + '.log')}")

    # ------------------------------------------------------------------ down
    def down(self, quiet: bool = False) -> None:
        """Stop every process of the cluster and remove its state."""
        # Our operators and kwokctl's components (its pid files), all at once: stopping them
        # one by one, as `kwokctl delete cluster` does, takes ten seconds for nothing since
        # the state is deleted anyway.
        procs = {**self.component_pids(), **self.operator_pids()}
        # A pid file may outlive its process and the pid be reused: only processes whose
        # command line names this cluster's directory are ours.
        ours = {name: pid for name, pid in procs.items() if runs_in(pid, self.dir)}
        _terminate_all(list(ours.values()))
        node.clean_up(node.Paths(self.dir / "node"), _kube_proxy())
        if not quiet and ours:
            _say("stopped " + ", ".join(sorted(ours)))
        shutil.rmtree(self.dir, ignore_errors=True)
        (config.state_root() / f"{self.name}-kwokctl.yaml").unlink(missing_ok=True)
        # The training operator's certificates (a path it hard-codes) stay: another local
        # cluster's operators may be reading them, and the next `up` writes its own.
        if not quiet:
            _say(f"cluster {self.name!r} stopped and its state removed")

    # ------------------------------------------------------------------ faults
    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, SIGKILL after 10 s), and kube-controller-manager
        and kube-scheduler as their lost lease would; the rest of the cluster is left
        running. `start_apiserver` starts them again with the same command lines."""
        pids = self.component_pids()
        if not runs_in(pids.get("kube-apiserver", 0), self.dir):
            raise ClusterError(f"kube-apiserver of {self.name!r} is not running")
        # Every component's command line: any that exits while the API server is away
        # (with leader election on, kube-controller-manager and kube-scheduler did, and a
        # kubelet would start them again) is started again by `start_apiserver`.
        saved = {}
        for name, pid in pids.items():
            proc = Path(f"/proc/{pid}")
            with contextlib.suppress(OSError):
                saved[name] = {"argv": [a.decode() for a in (proc / "cmdline").read_bytes()
                                        .split(b"\0") if a],
                               "cwd": os.readlink(proc / "cwd")}
        (self.dir / STOPPED_FILE).write_text(json.dumps(saved))
        _terminate_all([pids["kube-apiserver"]], grace=10)
        # They run here without leader election (_component_patches). With it, as in
        # production, each exits when it cannot renew its lease for 10 s, and a new one
        # starts from a fresh listing. Left running instead, the Job controller came back
        # from a 20 s outage with a stale view and made Jobs a pod more than they needed
        # (the outage fault test: gangs that ran three pods of two). So they go as their
        # lease would make them go, and `start_apiserver` starts them again.
        followers = [pids[name] for name in LEASE_HOLDERS
                     if runs_in(pids.get(name, 0), self.dir)]
        _terminate_all(followers, grace=10)

    def start_apiserver(self, timeout: float = 120) -> None:
        """Start the kube-apiserver `stop_apiserver` stopped, wait until it is ready, and
        start again whatever component exited meanwhile."""
        saved_file = self.dir / STOPPED_FILE
        saved = json.loads(saved_file.read_text())
        self._respawn("kube-apiserver", saved["kube-apiserver"])
        wait_for(self.apiserver_ready, timeout, "kube-apiserver /readyz after its restart")
        pids = self.component_pids()
        for name, how in saved.items():
            if name != "kube-apiserver" and not runs_in(pids.get(name, 0), self.dir):
                _say(f"{name} exited while kube-apiserver was away: starting it again")
                self._respawn(name, how)
        saved_file.unlink()

    def _respawn(self, name: str, how: dict[str, Any]) -> None:
        spawn(how["argv"], self.logs / f"{name}.log", self.dir / "pids" / f"{name}.pid",
              Path(how["cwd"]))

    # ------------------------------------------------------------------ info
    def env_script(self) -> str:
        kubectl_dir = build.installed("kubernetes")
        return (f"export KUBECONFIG={self.kubeconfig}\n"
                f"export PATH={kubectl_dir}:$PATH\n")

    def print_usage(self) -> None:
        print(
            f"Local cluster {self.name!r} is up.\n"
            f"  kubeconfig: {self.kubeconfig}\n"
            f"  use it:     eval \"$(python -m localcluster env)\"   # sets KUBECONFIG, PATH\n"
            f"              kubectl get nodes\n"
            f"  logs:       {self.logs}/\n"
            f"  stop:       python -m localcluster down"
        )

    def status(self) -> dict[str, Any]:
        info = self.ready_info() or {}
        return {
            "name": self.name,
            "state_dir": str(self.dir),
            "set_up": bool(info),
            "apiserver_ready": self.apiserver_ready(),
            "processes": self.processes(),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "profile": info.get("profile"),
        }


# ---------------------------------------------------------------------------- helpers

_TRAINING_ENV = {"MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE, "TMPDIR": "/tmp"}


def _training_args(kubeconfig: str, probe_port: int, webhook_port: int,
                   directory: Path) -> list[str]:
    return ["--kubeconfig", kubeconfig, "--metrics-bind-address", "0",
            "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
            "--webhook-server-port", str(webhook_port), "--leader-elect=false",
            # Its PyTorchJob workers' init container (a shell that waits for the master's
            # name), from an image a real node has (localcluster/node_images.py).
            "--pytorch-init-container-image", node_images.BUSYBOX,
            "--pytorch-init-container-template-file", str(directory / PYTORCH_INIT_FILE)]


PYTORCH_INIT_FILE = "pytorch-init-container.yaml"
#: The training operator's own init container for PyTorchJob workers, but for how it reads
#: nslookup's answer: Debian's static busybox (the real node's) exits 1 when one of the
#: pod's search domains has no such name, although another answered.
PYTORCH_INIT_CONTAINER = yaml.safe_dump([{
    "name": "init-pytorch", "image": "{{.InitContainerImage}}",
    "imagePullPolicy": "IfNotPresent",
    "resources": {"limits": {"cpu": "100m", "memory": "20Mi"},
                  "requests": {"cpu": "50m", "memory": "10Mi"}},
    "command": ["sh", "-c", "err=1;for i in $(seq {{.MaxTries}}); do "
                "if nslookup {{.MasterAddr}} | grep -q '^Name:'; then err=0 && break; fi;"
                "echo waiting for master; sleep 2; done; exit $err"]}], sort_keys=False)


def _kube_proxy() -> Path | None:
    """kube-proxy, which removes its own rules, if it was ever built."""
    try:
        return build.binary("kubernetes", "kube-proxy")
    except build.BuildError:
        return None


def _binaries(required: bool = True) -> dict[str, Path]:
    out: dict[str, Path] = {}
    wanted = {
        "etcd": ("etcd", "etcd"),
        "kube-apiserver": ("kubernetes", "kube-apiserver"),
        "kube-controller-manager": ("kubernetes", "kube-controller-manager"),
        "kube-scheduler": ("kubernetes", "kube-scheduler"),
        "kubectl": ("kubernetes", "kubectl"),
        "kwok": ("kwok", "kwok"),
        "kwokctl": ("kwok", "kwokctl"),
    }
    for key, (wrapper, exe) in wanted.items():
        try:
            out[key] = build.binary(wrapper, exe)
        except build.BuildError:
            if required:
                raise
    return out


def _build_ids() -> dict[str, str]:
    return {name: build.bin_dir(w).name for name, w in versions.WRAPPERS.items()}


def _kwok_env() -> dict[str, str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(config.state_root())
    return env


JOB_SYNCS = 25  # kube-controller-manager --concurrent-job-syncs (see _component_patches)


# Components that would exit with a lost lease when the API server is away, were their
# leader election on (see stop_apiserver).
LEASE_HOLDERS = ("kube-controller-manager", "kube-scheduler")


def _component_patches(directory: Path, real_node: bool = False) -> list[dict[str, Any]]:
    """Flags of the control plane's components beyond kwokctl's (a cluster started with
    others is not reused)."""
    # One of each, so no leader to elect: with leader election on, a renewal that
    # timed out on a busy machine made them exit (both died in a loaded bench run,
    # leaving Jobs without pods and namespaces never deleted).
    patches: list[dict[str, Any]] = [
        {"name": "kube-controller-manager", "extraArgs": [
            {"key": "leader-elect", "value": "false"},
            # The Job controller's workers (5 by default) each wait on an API server
            # that shares 2 cores with everything else: 0.2 s a sync, where a real
            # control plane takes a few ms. Five queued a new Job for 3.5 s on
            # average in bench/e2e.py (4.4 s when created directly); 25, 0.1-0.8 s.
            {"key": "concurrent-job-syncs", "value": str(JOB_SYNCS)}]},
        {"name": "kube-scheduler", "extraArgs": [{"key": "leader-elect", "value": "false"}]},
        # kwok plays the kubelet of the profiles' nodes only (they carry its annotation):
        # a real node's kubelet (localcluster/node.py) keeps its own.
        {"name": "kwok-controller", "extraArgs": [
            {"key": "manage-all-nodes", "value": "false"},
            {"key": "manage-nodes-with-annotation-selector",
             "value": f"{profiles.KWOK_ANNOTATION}=fake"}]},
    ]
    if real_node:
        # Pods reach the API server through the `kubernetes` Service, whose endpoint is
        # the advertised address: the real node's bridge, which only the machine and its
        # pods reach (loopback is not reachable from a pod).
        patches.append({"name": "kube-apiserver", "extraArgs": [
            {"key": "bind-address", "value": "0.0.0.0"},
            {"key": "advertise-address", "value": node.GATEWAY},
            # Logs and exec reach the real node's kubelet, which knows the cluster's CA.
            {"key": "kubelet-client-certificate", "value": str(directory / "pki/admin.crt")},
            {"key": "kubelet-client-key", "value": str(directory / "pki/admin.key")},
            # The node's name resolves nowhere: its address does.
            {"key": "kubelet-preferred-address-types", "value": "InternalIP"}]})
    return patches


def _kwokctl_config(bins: dict[str, Path], block: ports.PortBlock, directory: Path,
                    real_node: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "etcdBinary": str(bins["etcd"]),
            "kubeApiserverBinary": str(bins["kube-apiserver"]),
            "kubeControllerManagerBinary": str(bins["kube-controller-manager"]),
            "kubeSchedulerBinary": str(bins["kube-scheduler"]),
            "kwokControllerBinary": str(bins["kwok"]),
            "kubectlBinary": str(bins["kubectl"]),
            "securePort": True,
            # Every port from the cluster's own block (localcluster/ports.py).
            "kubeApiserverPort": block.port("kube-apiserver"),
            "etcdPort": block.port("etcd"),
            "etcdPeerPort": block.port("etcd-peer"),
            "kubeControllerManagerPort": block.port("kube-controller-manager"),
            "kubeSchedulerPort": block.port("kube-scheduler"),
            "kwokControllerPort": block.port("kwok-controller"),
            "kubeAuthorization": True,
            "kubeAdmission": True,
            "enableCRDs": ["Stage"],
            "disableQPSLimits": True,
            "cacheDir": str(config.state_root() / "kwokctl-cache"),
            # What pods on a real node call it by: the `kubernetes` Service's address and
            # the host's (its advertised endpoint).
            "kubeApiserverCertSANs": [node.API_SERVICE_IP, node.GATEWAY],
        },
        "componentsPatches": _component_patches(directory, real_node),
    }


def crd_files() -> list[Path]:
    files = []
    for src in versions.CRDS:
        d = Path(build.module_dirs(src.wrapper)[src.module])
        for f in src.files:
            p = d / f
            if not p.exists():
                raise ClusterError(f"CRD file {f} not found in {d} (module {src.module})")
            files.append(p)
    return files


_CRD_NAME = re.compile(r"^metadata:[ \t]*\n(?:[ \t]+.*\n)*?[ \t]+name:[ \t]*(\S+)", re.M)


def crd_name(path: Path) -> str:
    """``metadata.name`` of a CRD file, without parsing megabytes of schema as YAML."""
    m = _CRD_NAME.search(path.read_text())
    if not m:
        raise ClusterError(f"no metadata.name in {path}")
    return m.group(1).strip("'\"")


def _crd_established(kubectl: Kubectl, name: str) -> bool:
    r = kubectl.run("get", "crd", name, "-o",
                    "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                    check=False)
    return r.returncode == 0 and r.stdout.strip() == "True"


def _read_pids(directory: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in directory.glob("*.pid") if directory.is_dir() else []:
        with contextlib.suppress(ValueError):
            out[f.stem] = int(f.read_text().strip())
    return out


def _terminate_all(pids: list[int], grace: float = 2) -> None:
    """SIGTERM every process, then SIGKILL whatever is still alive after ``grace``.

    The grace is short on purpose: kube-apiserver drains for many seconds and etcd and
    kube-scheduler take five or more, which buys nothing when their state is deleted next.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running(profile: str = config.DEFAULT_PROFILE, keep: bool = False) -> Iterator[Cluster]:
    """Context manager: a ready cluster; stopped on exit unless it was already running."""
    c = Cluster()
    was_running = c.is_running()
    c.up(profile=profile)
    try:
        yield c
    finally:
        if not was_running and not keep:
            c.down()
