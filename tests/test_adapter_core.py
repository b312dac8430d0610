"""The sans-I/O core alone: its operations driven by a script, no server.

The steps an operation yields are its whole conversation with the API server, so they can
be checked exactly: which request comes when, what a transport failure becomes, where a
retry pauses. Behaviour against the real API server is tests/test_adapter_kube.py's (on
both drivers); this file pins the protocol the two drivers share.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.core import (
    CONFLICT_BACKOFF_CAP_S,
    MAX_RETRIES,
    AdapterCore,
    ApiStatusError,
    BeforeRequest,
    ConnectionLost,
    DriverError,
    NoAnswer,
    NotConnected,
    Operation,
    Pause,
    Send,
    Stepper,
    conflict_backoff,
)
from adapter.errors import (
    AdapterError,
    Conflict,
    DeadlinePassed,
    NotFound,
    Rejected,
    Unreachable,
)
from adapter.types import CallMeta, Capability, PreflightResult, Ref
from holdwarden.config import Config

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
REF = Ref("team-a", "llm")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def trainjob(rv: str = "1", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": REF.name,
            "namespace": REF.namespace,
            "uid": "u-1",
            "resourceVersion": rv,
            "annotations": annotations or {},
        },
        "spec": {"suspend": False, "runtimeRef": {"name": "torch"}},
    }


def plain_core(clock: Clock) -> AdapterCore:
    core = AdapterCore(Config(mode="plain", holder="dispatch"), clock=clock)
    ok = Capability(True, "test")
    core._preflights[REF.namespace] = PreflightResult(  # as if preflight had passed
        mode="plain",
        namespace=REF.namespace,
        hold_round_trip=ok,
        update_workloads=ok,
        update_trainjobs=ok,
        list_pods=ok,
        enforcer_installed=ok,
    )
    return core


Answer = Any | DriverError
"""What the script answers a Send with: a decoded body, or a failure to throw in."""


def drive(operation: Operation[Any], answer: Callable[[Send], Answer]) -> list[Any]:
    """Run ``operation`` to its end with the drivers' ``Stepper``; returns the steps it
    yielded and, last, its result (or the adapter error it raised)."""
    steps: list[Any] = []
    with Stepper(operation) as run:
        try:
            while (step := run.next()) is not None:
                steps.append(step)
                if isinstance(step, Send):
                    got = answer(step)
                    if isinstance(got, DriverError):
                        run.fail(got)
                    else:
                        run.reply(got)
        except AdapterError as exc:
            return [*steps, exc]
        return [*steps, run.result]


def conflict() -> ApiStatusError:
    return ApiStatusError(409, "Conflict", json.dumps({"message": "the object has changed"}))


def test_a_plain_hold_is_hook_get_hook_patch_and_the_patch_keeps_the_read_version() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core._hold(REF, CallMeta(NOW + timedelta(seconds=10), 3), "node lost"),
        lambda send: trainjob("41") if send.http.method == "GET" else None,
    )
    kinds = [type(step).__name__ for step in steps[:-1]]
    assert kinds == ["BeforeRequest", "Send", "BeforeRequest", "Send"]
    get, patch = steps[1], steps[3]
    assert (get.http.method, get.http.path) == (
        "GET",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/llm",
    )
    assert patch.http.method == "PATCH"
    assert patch.http.content_type == "application/merge-patch+json"
    assert patch.http.body["metadata"]["resourceVersion"] == "41"
    assert patch.http.body["spec"] == {"suspend": True}
    assert steps[-1] is None and core.request_count == 2
    assert all(0 < s.timeout <= 10 for s in (get, patch))


@pytest.mark.parametrize(
    ("failure", "error", "words"),
    [
        (NotConnected("connection refused"), Unreachable, "not sent"),
        (NoAnswer("read timed out"), Rejected, "may still land within call_bound"),
        (ConnectionLost("reset by peer"), AdapterError, "lost after the request was sent"),
        (ApiStatusError(404, "Not Found", "{}"), NotFound, "not found"),
        (ApiStatusError(403, "Forbidden", '{"message": "nope"}'), Rejected, "nope"),
    ],
)
def test_each_driver_failure_becomes_its_error_class(
    failure: DriverError, error: type[AdapterError], words: str
) -> None:
    clock = Clock()
    core = plain_core(clock)
    result = drive(core._observe(REF), lambda send: failure)[-1]
    assert type(result) is error and words in str(result), result
    if isinstance(failure, NotConnected):
        assert "may still land" not in str(result)


def test_a_timeout_cut_off_by_the_deadline_is_deadline_passed() -> None:
    clock = Clock()
    core = plain_core(clock)

    def late(send: Send) -> Answer:
        clock.now = NOW + timedelta(seconds=11)  # the answer never came before the deadline
        return NoAnswer("timed out")

    result = drive(core._hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"), late)[-1]
    assert isinstance(result, DeadlinePassed) and "may still land" in str(result)


def test_conflicts_pause_before_each_retry_then_conflict_after_nine_tries() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core._hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        lambda send: trainjob() if send.http.method == "GET" else conflict(),
    )
    assert isinstance(steps[-1], Conflict) and "9 tries" in str(steps[-1])
    patches = [s for s in steps if isinstance(s, Send) and s.http.method == "PATCH"]
    pauses = [s for s in steps if isinstance(s, Pause)]
    assert len(patches) == 1 + MAX_RETRIES and len(pauses) == MAX_RETRIES
    assert all(0 <= p.seconds <= CONFLICT_BACKOFF_CAP_S for p in pauses)
    # Each pause comes right before a retry's read (after the conflicted write).
    for index, step in enumerate(steps[:-1]):
        if isinstance(step, Pause):
            assert isinstance(steps[index + 1], BeforeRequest)
            assert steps[index + 2].http.method == "GET"


def test_no_pause_is_taken_that_would_reach_the_deadline() -> None:
    clock = Clock()
    core = plain_core(clock)
    core._random.random = lambda: 0.999  # type: ignore[method-assign]  # the longest pauses
    steps = drive(
        core._hold(REF, CallMeta(NOW + timedelta(milliseconds=3), 1), "r"),
        lambda send: trainjob() if send.http.method == "GET" else conflict(),
    )
    assert not [s for s in steps if isinstance(s, Pause) and s.seconds >= 0.003]


@pytest.mark.parametrize(
    ("attempt", "draw", "seconds"),
    [
        (0, 0.5, 0.0),
        (1, 0.0, 0.0),
        (1, 0.5, 0.002),
        (2, 0.5, 0.004),
        (3, 0.5, 0.008),
        (4, 1.0, 0.025),  # 0.032 capped
        (8, 0.5, 0.0125),
        (8, 2.0, 0.025),  # a draw out of range is clamped
    ],
)
def test_conflict_backoff_table(attempt: int, draw: float, seconds: float) -> None:
    assert conflict_backoff(attempt, draw) == pytest.approx(seconds)


@given(st.integers(min_value=1, max_value=64), st.floats(min_value=0, max_value=1))
def test_conflict_backoff_is_bounded_and_grows_with_the_attempt(attempt: int, draw: float) -> None:
    pause = conflict_backoff(attempt, draw)
    assert 0 <= pause <= CONFLICT_BACKOFF_CAP_S
    assert pause <= conflict_backoff(attempt + 1, draw) + 1e-12
