"""One local control plane with a real node (``LocalCluster(pods=True)``), shared by the
tests in this folder: containerd, runc, CNI, kubelet, kube-proxy, kube-scheduler and
kube-controller-manager's ordinary controllers (rig/localcluster/realnode.py).

Part of the default run (``make test``). If a binary cannot be built, a Debian package
cannot be installed or a component does not start, the fixture fails the tests with the
component's log tail; it never skips them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from rig.localcluster import LocalCluster

_REPORT: list[str] = []


@pytest.fixture(scope="session")
def pods_cluster() -> Iterator[LocalCluster]:
    started = time.monotonic()
    local = LocalCluster(pods=True)
    local.start()
    _REPORT.append(
        f"real node: control plane and node started in {time.monotonic() - started:.1f}s "
        + ", ".join(f"{k} {v:.1f}s" for k, v in local.phase_seconds.items())
    )
    try:
        yield local
    finally:
        local.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _REPORT:
        terminalreporter.write_line(line)


def report(line: str) -> None:
    """Print ``line`` in the run's summary."""
    _REPORT.append(line)


def report_rss(cluster: LocalCluster, when: str) -> None:
    """Print (in the summary) every component's RSS now."""
    rss = cluster.rss_kib()
    _REPORT.append(
        f"real node: RSS {when}: "
        + ", ".join(f"{name} {kib / 1024:.0f} MiB" for name, kib in sorted(rss.items()))
    )


@pytest.fixture
def pods_namespace(pods_cluster: LocalCluster) -> str:
    return pods_cluster.create_namespace(f"p-{uuid.uuid4().hex[:10]}")
