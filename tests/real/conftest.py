"""One local control plane running the real Kueue, Trainer, JobSet and
kube-controller-manager, shared by the tests in this folder.

The controllers run as their real service-account identities with their own admission
webhooks registered (rig/localcluster/controllers.py). If any of them cannot be
built or cannot start, the fixture fails the tests with that controller's log tail; it
never skips them.

The suite is part of the default run (``make test``; ``make test-real`` runs it alone).
``make binaries`` builds the controllers first; a bare ``pytest`` builds any that are
missing when the first test here needs them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from rig.localcluster import LocalCluster
from rig.localcluster.controllers import CONTROLLERS

REAL_NAMESPACE_LABEL = "holdwarden-real-test"


_RSS: dict[str, tuple[int, int]] = {}
_STARTUP: list[float] = []


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(controllers=CONTROLLERS)
    local.start()
    _STARTUP.append(local.phase_seconds.get("controllers", 0.0))
    try:
        yield local
    finally:
        # Read before stop(): (current, peak) RSS of each controller after the whole suite.
        if local.controllers is not None:
            _RSS.update(local.controllers.rss_kib())
        local.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _STARTUP:
        terminalreporter.write_line(f"real controllers: started in {_STARTUP[0]:.1f}s")
    for name, (current, peak) in sorted(_RSS.items()):
        terminalreporter.write_line(
            f"real controllers: {name} RSS {current / 1024:.0f} MiB (peak {peak / 1024:.0f} MiB)"
        )


@pytest.fixture
def real_admin(real_cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    api = real_cluster.api_client()
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def real_namespace(real_cluster: LocalCluster) -> str:
    """A fresh namespace per test (never deleted: names are unique)."""
    return real_cluster.create_namespace(
        f"r-{uuid.uuid4().hex[:10]}", labels={REAL_NAMESPACE_LABEL: "true"}
    )
