"""Every version the local cluster uses, in one place.

Change a version here, run ``python -m localcluster pin`` (it rewrites the wrapper modules'
``go.mod``/``go.sum`` under ``localcluster/go/``) and commit the result: ``go.sum`` pins the
hash of every module download. ``python -m localcluster build`` refuses to build when a
``go.mod`` disagrees with this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Kubernetes control plane and kubectl (``k8s.io/kubernetes``); its staging modules
#: (``k8s.io/api``, ``k8s.io/client-go``, …) are pinned to the matching ``v0.x`` release.
KUBERNETES = "v1.34.3"
#: etcd server (``go.etcd.io/etcd/server/v3``).
ETCD = "v3.6.16"
#: kwok and kwokctl (``sigs.k8s.io/kwok``).
KWOK = "v0.7.0"
#: KubeRay operator and its CRDs (``github.com/ray-project/kuberay/ray-operator``).
KUBERAY = "v1.5.1"
#: Kubeflow training operator v1 and its CRDs (``github.com/kubeflow/training-operator``).
TRAINING_OPERATOR = "v1.9.3"
#: The last training-operator release with MXJob: its CRD, and its operator run with only the
#: MXJob controller enabled beside TRAINING_OPERATOR.
TRAINING_OPERATOR_MXJOB = "v1.8.1"
#: JobSet controller and CRD (``sigs.k8s.io/jobset``).
JOBSET = "v0.10.1"
#: LeaderWorkerSet controller and CRD (``sigs.k8s.io/lws``); the newest release the module
#: proxy serves whole (v0.10.0's zip is refused).
LWS = "v0.9.0"
#: kuttl, the test tool MCAD's end-to-end suites are written for (``github.com/kudobuilder/kuttl``).
KUTTL = "v0.24.0"
#: kuttl up to v0.24.0 does not compile with Go 1.26 (``testing.MainStart``'s deps interface
#: grew a method): it is built with this toolchain, which ``go`` fetches through the module
#: proxy (``GOTOOLCHAIN``), so its wrapper's ``go`` directive must not be newer.
KUTTL_TOOLCHAIN = "go1.25.4"
#: codeflare's AppWrapper controller (``github.com/project-codeflare/appwrapper``): its
#: end-to-end suite (its Go package ``test/e2e``, compiled by ``go test -c``) runs against the
#: dispatcher serving v1beta2, and the controller itself, with Kueue, is a peer in bench/peers.py.
APPWRAPPER = "v1.2.1"
KUEUE = "v0.17.0"
#: CoreDNS (``github.com/coredns/coredns``): the real node's cluster DNS (localcluster/node.py),
#: with the plugins of Kubernetes' own Corefile only.
COREDNS = "v1.15.0"
#: Helm (``helm.sh/helm/v3``), to render and lint the chart in charts/ (``make chart-lint``).
HELM = "v3.22.0"
#: kustomize (``sigs.k8s.io/kustomize/kustomize/v5``, the version kubectl embeds), to render
#: deploy/ into the release's install.yaml: `make release` builds it and helm only.
KUSTOMIZE = "v5.7.1"
#: What `make release` needs (``python -m localcluster build helm kustomize``).
RELEASE_TOOLS = ("helm", "kustomize")
#: ``go`` directive written into the wrapper modules.
GO_DIRECTIVE = {"default": "1.24.0", "etcd": "1.26.0", "kuttl": "1.25.0", "helm": "1.26.0",
                "appwrapper": "1.26.0", "lws": "1.26.0",
                "kueue": "1.26.0", "coredns": "1.26.0"}


#: The control plane, kubectl, and what the real node runs (kubelet, kube-proxy): one
#: ``go build`` compiles the packages they share once.
KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
                       "kubelet", "kube-proxy")


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """``v1.34.3`` -> ``v0.34.3``: the release of the k8s.io staging modules."""
    return "v0." + kubernetes.removeprefix("v1.")


def _k8s_ldflags(version: str) -> list[str]:
    """The version stamps Kubernetes' own build (hack/lib/version.sh) links in.

    Without them the binaries report ``v0.0.0-master``: kwokctl reads ``--version`` of every
    binary to choose its flags, and kubectl would warn about version skew.
    """
    major, minor = version.removeprefix("v").split(".")[:2]
    out = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        out += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return out


def _helm_ldflags(version: str, kubernetes: str = KUBERNETES) -> list[str]:
    """The stamps of Helm's own Makefile: its version, and the Kubernetes version that
    ``helm template`` and ``helm lint`` assume without a cluster (here: the local cluster's)."""
    major, minor = kubernetes.removeprefix("v").split(".")[:2]
    out = [f"-X helm.sh/helm/v3/internal/version.version={version}",
           "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        out += [f"-X {pkg}.k8sVersionMajor={major}", f"-X {pkg}.k8sVersionMinor={minor}"]
    return out


@dataclass(frozen=True)
class Wrapper:
    """A Go wrapper module under ``localcluster/go/<name>``."""

    name: str
    #: module path -> version, written as ``require`` lines.
    requires: dict[str, str]
    #: package paths built into binaries (``tool`` lines; ``.`` for a main in the wrapper).
    packages: tuple[str, ...] = ()
    #: packages whose tests are compiled into a binary each (``go test -c``), named
    #: ``<last path element>.test``; their test-only requirements are pinned by ``go get -t``.
    tests: tuple[str, ...] = ()
    #: binary file names produced by ``go build -o DIR packages...`` (and ``go test -c``).
    binaries: tuple[str, ...] = ()
    #: extra ``-ldflags`` (besides ``-s -w``).
    ldflags: tuple[str, ...] = ()
    #: True when ``k8s.io/*`` staging modules must be replaced by their releases.
    replace_staging: bool = False
    go: str = field(default=GO_DIRECTIVE["default"])
    #: extra environment for ``go`` (e.g. another ``GOTOOLCHAIN``).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The version of the wrapper's main requirement (first ``requires`` entry)."""
        return next(iter(self.requires.values()))


WRAPPERS: dict[str, Wrapper] = {
    w.name: w
    for w in (
        Wrapper(
            name="etcd",
            requires={"go.etcd.io/etcd/server/v3": ETCD},
            packages=(".",),
            binaries=("etcd",),
            go=GO_DIRECTIVE["etcd"],
        ),
        Wrapper(
            name="kubernetes",
            requires={"k8s.io/kubernetes": KUBERNETES},
            packages=tuple(
                f"k8s.io/kubernetes/cmd/{c}"
                for c in KUBERNETES_COMMANDS
            ),
            binaries=KUBERNETES_COMMANDS,
            ldflags=tuple(_k8s_ldflags(KUBERNETES)),
            replace_staging=True,
        ),
        Wrapper(
            name="kwok",
            requires={"sigs.k8s.io/kwok": KWOK},
            packages=("sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok/cmd/kwokctl"),
            binaries=("kwok", "kwokctl"),
        ),
        Wrapper(
            name="kuberay",
            requires={"github.com/ray-project/kuberay/ray-operator": KUBERAY},
            packages=("github.com/ray-project/kuberay/ray-operator",),
            binaries=("ray-operator",),
        ),
        Wrapper(
            name="training-operator",
            requires={"github.com/kubeflow/training-operator": TRAINING_OPERATOR},
            packages=("github.com/kubeflow/training-operator/cmd/training-operator.v1",),
            binaries=("training-operator.v1",),
        ),
        Wrapper(
            name="mxjob-operator",
            requires={"github.com/kubeflow/training-operator": TRAINING_OPERATOR_MXJOB},
            packages=("github.com/kubeflow/training-operator/cmd/training-operator.v1",),
            binaries=("training-operator.v1",),
        ),
        Wrapper(
            name="jobset",
            requires={"sigs.k8s.io/jobset": JOBSET},
            packages=("sigs.k8s.io/jobset",),
            binaries=("jobset",),
        ),
        Wrapper(
            name="lws",
            requires={"sigs.k8s.io/lws": LWS},
            # The controller's main package is the module's cmd/, built as `cmd`.
            packages=("sigs.k8s.io/lws/cmd",),
            binaries=("cmd",),
            go=GO_DIRECTIVE["lws"],
        ),
        Wrapper(
            name="kuttl",
            requires={"github.com/kudobuilder/kuttl": KUTTL},
            packages=("github.com/kudobuilder/kuttl/cmd/kubectl-kuttl",),
            binaries=("kubectl-kuttl",),
            go=GO_DIRECTIVE["kuttl"],
            # sum.golang.org answers 404 for this module here; the committed go.sum pins
            # its hash (and every other download's) all the same.
            env={"GOTOOLCHAIN": KUTTL_TOOLCHAIN, "GONOSUMDB": "github.com/kudobuilder/kuttl"},
        ),
        Wrapper(
            name="helm",
            requires={"helm.sh/helm/v3": HELM},
            packages=("helm.sh/helm/v3/cmd/helm",),
            binaries=("helm",),
            ldflags=tuple(_helm_ldflags(HELM)),
            go=GO_DIRECTIVE["helm"],
        ),
        Wrapper(
            name="kustomize",
            requires={"sigs.k8s.io/kustomize/kustomize/v5": KUSTOMIZE},
            packages=("sigs.k8s.io/kustomize/kustomize/v5",),
            binaries=("kustomize",),
        ),
        Wrapper(
            name="appwrapper",
            requires={"github.com/project-codeflare/appwrapper": APPWRAPPER},
            # Its controller (the module's cmd/, built as `cmd`: a peer in bench/peers.py)
            # and its e2e suite share most packages: one build compiles them once.
            packages=("github.com/project-codeflare/appwrapper/cmd",),
            tests=("github.com/project-codeflare/appwrapper/test/e2e",),
            binaries=("cmd", "e2e.test"),
            go=GO_DIRECTIVE["appwrapper"],
            # Not in the checksum database; the committed go.sum pins its hash all the same.
            env={"GONOSUMDB": "github.com/project-codeflare/appwrapper"},
        ),
        # The peer users run today, beside the dispatcher (bench/peers.py, its cluster test).
        Wrapper(
            name="kueue",
            requires={"sigs.k8s.io/kueue": KUEUE},
            packages=("sigs.k8s.io/kueue/cmd/kueue",),
            binaries=("kueue",),
            ldflags=(f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={KUEUE}",),
            go=GO_DIRECTIVE["kueue"],
        ),
        Wrapper(
            name="coredns",
            requires={"github.com/coredns/coredns": COREDNS},
            packages=(".",),
            binaries=("coredns",),
            ldflags=(f"-X github.com/coredns/coredns/coremain.GitCommit={COREDNS}",),
            go=GO_DIRECTIVE["coredns"],
        ),
        Wrapper(
            name="crds",
            requires={
                "github.com/kubeflow/training-operator": TRAINING_OPERATOR_MXJOB,
                "sigs.k8s.io/jobset": JOBSET,
            },
        ),
    )
}

#: What ``build`` builds, in the order it reports them (it starts build.LONGEST first).
BUILD_ORDER: tuple[str, ...] = (
    # Kueue, the second longest, starts beside Kubernetes, not last after all the others.
    "kueue", "etcd", "kwok", "kuberay", "training-operator", "crds", "kuttl", "kubernetes",
    "mxjob-operator", "jobset", "lws", "helm", "kustomize", "appwrapper", "coredns",
)


@dataclass(frozen=True)
class CrdSource:
    """CRD YAML files inside a module download."""

    wrapper: str
    module: str
    files: tuple[str, ...]


CRDS: tuple[CrdSource, ...] = (
    CrdSource(
        "kuberay",
        "github.com/ray-project/kuberay/ray-operator",
        tuple(
            f"config/crd/bases/ray.io_{k}.yaml"
            for k in ("rayclusters", "rayjobs", "rayservices")
        ),
    ),
    CrdSource(
        "training-operator",
        "github.com/kubeflow/training-operator",
        tuple(
            f"manifests/base/crds/kubeflow.org_{k}.yaml"
            for k in ("tfjobs", "pytorchjobs", "xgboostjobs", "jaxjobs", "paddlejobs", "mpijobs")
        ),
    ),
    CrdSource(
        "crds",
        "github.com/kubeflow/training-operator",
        ("manifests/base/crds/kubeflow.org_mxjobs.yaml",),
    ),
    CrdSource(
        "crds",
        "sigs.k8s.io/jobset",
        ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    ),
    # Its controller also runs DisaggregatedSet's, which needs that CRD to start.
    CrdSource(
        "lws",
        "sigs.k8s.io/lws",
        tuple(f"config/crd/bases/{k}.yaml" for k in (
            "leaderworkerset.x-k8s.io_leaderworkersets",
            "disaggregatedset.x-k8s.io_disaggregatedsets")),
    ),
)
