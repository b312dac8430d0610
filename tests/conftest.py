"""Shared fixtures: one real local control plane per test session.

The control plane is real etcd and a real kube-apiserver (see rig.localcluster).
If it cannot start, the fixture fails the tests that need it with the server's own logs;
it never skips them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings
from kubernetes import client as k8s

from rig.localcluster import (
    EDITOR_USER,
    JOB_CONTROLLER_IDENTITY,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    TRAINER_IDENTITY,
    UNPRIVILEGED_USER,
    LocalCluster,
)

TEST_NAMESPACE_LABEL = "holdwarden-test"

# Hypothesis' per-example deadline (200 ms) is a timing assertion: under CPU contention
# (CI on a busy machine) examples of tests/unit/test_config.py took 216 and 311 ms and
# failed. Speed is measured by bench/, not by tests; every property keeps its examples.
settings.register_profile("holdwarden", deadline=None)
settings.load_profile("holdwarden")


_STARTED: list[LocalCluster] = []

# pytest-timeout's default (pyproject: 300 s, thread method) is the last resort: it ends the
# whole run with every thread's stack. An asyncio test is bounded first, inside its own
# event loop, because pytest-timeout's signal method raises inside an event-loop callback
# where asyncio swallows it. The asyncio budget is a little shorter, so it fires first and
# fails only the one test.
DEFAULT_TEST_TIMEOUT = 300.0
ASYNC_BUDGET_MARGIN = 20.0


def asyncio_budget(item: pytest.Item) -> float:
    """Seconds an asyncio test may run: its pytest-timeout less a margin, at least 1 s."""
    marker = item.get_closest_marker("timeout")
    configured = item.config.getini("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(configured or 0)
    limit = limit or DEFAULT_TEST_TIMEOUT
    return max(1.0, min(limit - ASYNC_BUDGET_MARGIN, limit * 0.9))


def bounded_coroutine(
    test: Callable[..., Awaitable[Any]], seconds: float, name: str
) -> Callable[..., Awaitable[Any]]:
    """``test`` run under ``asyncio.timeout(seconds)``; running out fails with its name.

    The wrapper keeps ``test``'s signature (functools.wraps), so fixtures resolve as before.
    """

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(seconds) as budget:
                return await test(*args, **kwargs)
        except TimeoutError:
            if budget.expired():
                pytest.fail(f"{name} did not finish within its asyncio budget of {seconds:.0f}s")
            raise

    return run


# The enforcer's transport runs on whichever event loop webhook.eventLoop names, so its
# tests (limits, backpressure, memory, drain) run on each: the default (uvloop) and
# asyncio's own. Every other asyncio test runs on asyncio's loop.
EVERY_LOOP_MODULES = frozenset({"test_webhook_connections.py", "test_webhook_shutdown.py"})


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio's hook: the loops an asyncio test runs on, by name (one: no test id)."""
    if item.path.name not in EVERY_LOOP_MODULES:
        return {"asyncio": asyncio.new_event_loop}
    from holdwarden.cli.enforcer import event_loop_factory
    from holdwarden.config import EVENT_LOOPS

    return {name: event_loop_factory(name) or asyncio.new_event_loop for name in EVENT_LOOPS}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Bound every asyncio test (and each example of an asyncio Hypothesis test)."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        budget = asyncio_budget(item)
        inner = getattr(getattr(item.obj, "hypothesis", None), "inner_test", None)
        if inspect.iscoroutinefunction(item.obj):
            item.obj = bounded_coroutine(item.obj, budget, item.nodeid)
        elif inner is not None and inspect.iscoroutinefunction(inner):
            item.obj.hypothesis.inner_test = bounded_coroutine(inner, budget, item.nodeid)


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
            f"local control plane: kube-apiserver {local.server_version}, started in "
            f"{local.startup_seconds:.1f}s ({phases}); CRDs: {local.crd_kind}"
        )
    lingering = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if lingering:
        terminalreporter.write_line(
            "threads still running as the session ends (a test that started a thread should "
            "end it): "
            + "; ".join(
                f"{t.name}{' (daemon)' if t.daemon else ''}, started by "
                f"{_THREAD_STARTED_BY.get(t.ident or 0, 'the session')}"
                for t in lingering
            )
        )


# Which test started each thread still running after it: a thread a test leaves running
# outlives it, and one blocked in a system call can still be running when the interpreter
# exits (CI saw a lane end "Aborted" after its last test passed). Reported at the end.
_THREAD_STARTED_BY: dict[int, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    for thread in threading.enumerate():
        if thread.ident not in before and thread.ident is not None:
            _THREAD_STARTED_BY.setdefault(thread.ident, item.nodeid)


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
def job_controller_client(cluster: LocalCluster) -> Iterator[k8s.ApiClient]:
    """kube-controller-manager's Job controller: it writes the pods of a TrainJob's Jobs."""
    yield from _client(cluster, JOB_CONTROLLER_IDENTITY)


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
