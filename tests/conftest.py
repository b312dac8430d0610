"""Shared fixtures: one real local control plane per test session.

The control plane is real etcd and a real kube-apiserver (see holdwarden.localcluster).
If it cannot start, the fixture fails the tests that need it with the server's own logs;
it never skips them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from holdwarden.localcluster import (
    EDITOR_USER,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    TRAINER_IDENTITY,
    UNPRIVILEGED_USER,
    LocalCluster,
)

TEST_NAMESPACE_LABEL = "holdwarden-test"


_STARTED: list[LocalCluster] = []


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    local.start()
    _STARTED.append(local)
    try:
        yield local
    finally:
        local.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for local in _STARTED:
        phases = ", ".join(f"{name} {secs:.1f}s" for name, secs in local.phase_seconds.items())
        terminalreporter.write_line(
            f"local control plane: started in {local.startup_seconds:.1f}s ({phases}); "
            f"CRDs: {local.crd_kind}"
        )


def _client(cluster: LocalCluster, user: str | None) -> Iterator[k8s.ApiClient]:
    api = cluster.api_client(user)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def admin_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, None)


@pytest.fixture
def kueue_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, KUEUE_IDENTITY)


@pytest.fixture
def trainer_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, TRAINER_IDENTITY)


@pytest.fixture
def supervisor_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, SUPERVISOR_IDENTITY)


@pytest.fixture
def editor_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, EDITOR_USER)


@pytest.fixture
def unprivileged_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    yield from _client(cluster, UNPRIVILEGED_USER)


@pytest.fixture
def namespace(cluster: LocalCluster) -> str:
    """A fresh namespace per test, labelled so webhooks can be scoped to test namespaces.

    No namespace controller runs, so namespaces are never deleted; names are unique.
    """
    return cluster.create_namespace(
        f"t-{uuid.uuid4().hex[:10]}", labels={TEST_NAMESPACE_LABEL: "true"}
    )
