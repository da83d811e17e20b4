# The two commands a newcomer needs (see README):
#   make demo   set up, start the local cluster, run the dispatcher on examples/
#   make test   set up, lint, type-check, unit tests, the installed wheel, cluster tests
#               and MCAD's own kuttl suites on a local control plane
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The dashboard's browser tests drive Debian's chromium through its chromedriver (never a
# downloaded browser): installed here when missing (as root, with apt-get).
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif command -v apt-get >/dev/null; then \
	  apt-get update -q && apt-get install -y -q chromium chromium-driver; \
	else echo "install chromium and its chromedriver at /usr/bin (the browser tests need them)"; exit 1; fi

# The real node's (localcluster/node.py: containerd, runc, the CNI plugins, iptables; busybox
# and gcc for its small images) and the image's build (mmdebstrap, umoci): Debian's packages,
# installed when missing (as root, with apt-get). Without them, their tests say so and are
# skipped (and fail under CI=true).
NODE_PACKAGES = $$($(PY) -c 'from localcluster.node_host import PACKAGES; print(*PACKAGES)') \
	mmdebstrap umoci
node-packages: setup
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; \
	else echo "the real node and the image need Debian's packages:" $$missing; fi

.PHONY: browser node-packages demo-real setup lint unit packaging cluster-build cluster-up cluster-down cluster-test conformance test demo bench release image chart-lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[controller,plot,test]'
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(VENV)/bin/ruff check dispatcher localcluster tests bench
	$(VENV)/bin/mypy dispatcher
	$(VENV)/bin/lint-imports
	$(PY) -m tests.function_length

unit: setup browser
	$(VENV)/bin/pytest -q tests/unit

# A plain (non-editable) install of the built wheel, in a fresh venv (needs PyPI).
PACKAGING_TEST = $(VENV)/bin/pytest -q tests/packaging
packaging: setup
	$(PACKAGING_TEST)

# --- local control plane (docs/development.md) ------------------------------
CLUSTER_BUILD = $(PY) -m localcluster build
cluster-build: setup
	$(CLUSTER_BUILD)

cluster-up: cluster-build
	$(PY) -m localcluster up

cluster-down: setup
	$(PY) -m localcluster down

cluster-test: cluster-build browser node-packages
	$(VENV)/bin/pytest -q tests/cluster

# MCAD's own kuttl suites (../shared/conformance/mcad-kuttl, or $MCAD_KUTTL) against
# `dispatcher run`; fails when a suite's result differs from tests/conformance/expected.yaml.
# Then codeflare's AppWrapper e2e suite (built by cluster-build) against `dispatcher run`
# serving v1beta2; fails when a spec differs from tests/conformance/appwrapper_e2e_expected.yaml.
# Without the files in ../shared each says so and is skipped (fails under CI=true), as are
# the unit tests that read them (MCAD_V1BETA1, MCAD_KUTTL, APPWRAPPER_V1BETA2). Both run,
# whatever the first gives.
conformance: cluster-build node-packages
	rc=0; $(PY) -m tests.conformance.mcad_kuttl || rc=1; \
	$(PY) -m tests.conformance.appwrapper_e2e || rc=1; exit $$rc

# Every suite, each as soon as what it needs is built (tests/pipeline.py): the Go build
# first, with the apt installs, lint, unit tests and the wheel beside it; the binaries only
# the peer tests and the conformance suites use are built while the cluster tests run.
test: setup
	$(PY) -m tests.pipeline

demo: cluster-up
	$(PY) -m dispatcher.demo

# The dispatcher installed by its chart on the local cluster's real node (as root), from the
# image built here, and a gang of two real containers run to completion.
demo-real: cluster-build node-packages
	$(PY) -m localcluster.real_demo

bench: setup
	$(PY) bench/engine.py

# --- release (docs/operations.md, "Install on a cluster") ----------------------------
# dist/: install.yaml (deploy/ in one file, the image tagged with the package's version;
# IMAGE=registry.example.com/dispatcher names another image), the packaged Helm chart,
# and the wheel. The image itself is built where a container registry is reachable.
HELM = $$($(PY) -c 'from localcluster.build import binary; print(binary("helm"))')

# Only helm and kustomize are built for it (minutes), not the control plane.
release: setup
	$(PY) -m localcluster build $$($(PY) -c 'from localcluster.versions import RELEASE_TOOLS; print(*RELEASE_TOOLS)')
	$(PY) -m localcluster.release --dist dist $(if $(IMAGE),--image $(IMAGE))
	$(PY) -m pip wheel -q --no-deps -w dist .

# dist/dispatcher-VERSION.oci.tar: the image as an OCI image archive, built with no container
# engine or registry (as root: mmdebstrap and chroot), each step cached; the Dockerfile is
# the same image for an engine (docs/operations.md, "Install on a cluster").
image: setup
	$(PY) -m localcluster image --out dist/

# tests/cluster/test_install.py lints it too (make cluster-test).
chart-lint: cluster-build
	$(HELM) lint --strict charts/dispatcher
	$(HELM) lint --strict charts/dispatcher -f charts/dispatcher/ci/everything-values.yaml

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache dist
