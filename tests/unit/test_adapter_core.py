"""The sans-I/O core alone: its operations driven by a script, no server.

The steps an operation yields are its whole conversation with the API server, so they can
be checked exactly: which request comes when, what a transport failure becomes, where a
retry pauses. Behaviour against the real API server is tests/controlplane/test_adapter_kube.py's (on
both drivers); this file pins the protocol the two drivers share.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.adapter.core import Core
from holdwarden.adapter.errors import (
    AdapterError,
    Conflict,
    DeadlinePassed,
    NotFound,
    Rejected,
    RuntimeMissing,
    Unreachable,
)
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.write_loop import (
    CHANGE_WAIT_S,
    CONFLICT_BACKOFF_CAP_S,
    MAX_RETRIES,
    conflict_backoff,
)
from holdwarden.adapter.steps import (
    ApiStatusError,
    BeforeRequest,
    ConnectionLost,
    DriverError,
    NextChange,
    NoAnswer,
    NotConnected,
    OpenWatch,
    Operation,
    Pause,
    Send,
    SendAll,
    Stepper,
    WatchFeed,
    WatchHandle,
    WatchView,
)
from holdwarden.adapter.types import CallMeta, Capability, PreflightResult, Ref, ReleaseResult
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


def plain_core(clock: Clock) -> Core:
    core = Core(Context(Config(mode="plain", holder="dispatch"), clock=clock))
    ok = Capability(True, "test")
    core.context.preflights[REF.namespace] = PreflightResult(  # as if preflight had passed
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


def drive(
    operation: Operation[Any],
    answer: Callable[[Send], Answer],
    watch: Callable[[OpenWatch | NextChange], Answer] | None = None,
) -> list[Any]:
    """Run ``operation`` to its end with the drivers' ``Stepper``; returns the steps it
    yielded and, last, its result (or the adapter error it raised). ``watch`` answers
    ``OpenWatch`` and ``NextChange``; without it a watch cannot be opened (a 403)."""
    steps: list[Any] = []
    with Stepper(operation) as run:
        try:
            while (step := run.next()) is not None:
                steps.append(step)
                got: Answer = None
                if isinstance(step, Send):
                    got = answer(step)
                elif isinstance(step, SendAll):
                    got = tuple(answer(send) for send in step.sends)
                elif isinstance(step, OpenWatch | NextChange):
                    got = watch(step) if watch else ApiStatusError(403, "Forbidden", "{}")
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
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 3), "node lost"),
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
    assert steps[-1] is None and core.context.request_count == 2
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
    result = drive(core.observe(REF), lambda send: failure)[-1]
    assert type(result) is error and words in str(result), result
    if isinstance(failure, NotConnected):
        assert "may still land" not in str(result)


def test_a_timeout_cut_off_by_the_deadline_is_deadline_passed() -> None:
    clock = Clock()
    core = plain_core(clock)

    def late(send: Send) -> Answer:
        clock.now = NOW + timedelta(seconds=11)  # the answer never came before the deadline
        return NoAnswer("timed out")

    result = drive(core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"), late)[-1]
    assert isinstance(result, DeadlinePassed) and "may still land" in str(result)


def test_conflicts_pause_before_each_retry_then_conflict_after_nine_tries() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
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
    core.context.random.random = lambda: 0.999  # type: ignore[method-assign]  # the longest pauses
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(milliseconds=3), 1), "r"),
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


# ---- retries read from a watch --------------------------------------------------------


HANDLE = WatchHandle(object())
"""The handle the scripted watch opens with."""


def watch_serving(*views: WatchView) -> Callable[[OpenWatch | NextChange], Answer]:
    """A watch that opens, then answers each NextChange with the next of ``views``."""
    queue = list(views)

    def answer(step: OpenWatch | NextChange) -> Answer:
        if isinstance(step, OpenWatch):
            return HANDLE
        assert step.watch is HANDLE and step.wait == CHANGE_WAIT_S
        return queue.pop(0)

    return answer


def sends(steps: list[Any], method: str) -> list[Send]:
    return [s for s in steps if isinstance(s, Send) and s.http.method == method]


def written_versions(steps: list[Any]) -> list[str]:
    """The resourceVersion each PATCH was preconditioned on, in order."""
    return [str((p.http.body or {})["metadata"]["resourceVersion"]) for p in sends(steps, "PATCH")]


def test_a_retry_reads_the_object_from_a_watch_opened_at_the_first_conflict() -> None:
    clock = Clock()
    core = plain_core(clock)
    tries = iter([conflict(), conflict(), None])
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        lambda send: trainjob("5") if send.http.method == "GET" else next(tries),
        watch_serving(
            WatchView(True, "MODIFIED", trainjob("6"), None),
            WatchView(False, "MODIFIED", trainjob("7"), None),  # no write came: the newest
        ),
    )
    assert steps[-1] is None, steps[-1]
    # One GET (the first try), one watch for the call, three writes: each carries the
    # resourceVersion of the very state it was decided on.
    assert len(sends(steps, "GET")) == 1
    opened = [s for s in steps if isinstance(s, OpenWatch)]
    assert len(opened) == 1 and not [s for s in steps if isinstance(s, Pause)]
    query = dict(opened[0].http.query)
    assert query["watch"] == "true" and query["fieldSelector"] == f"metadata.name={REF.name}"
    assert opened[0].http.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"
    assert 1 <= int(query["timeoutSeconds"]) <= 10  # lives no longer than the call
    assert written_versions(steps) == [
        "5",
        "6",
        "7",
    ]
    assert [r.verb for r in core.context.request_log] == [
        "get",
        "update",
        "watch",
        "update",
        "update",
    ]
    # The watch is a request like any other: the hook sees it before it is sent.
    assert isinstance(steps[steps.index(opened[0]) - 1], BeforeRequest)


@pytest.mark.parametrize(
    ("view", "why"),
    [
        (WatchView(True, "DELETED", trainjob("6"), None), "deleted"),
        (
            WatchView(
                True,
                "MODIFIED",
                {**trainjob("6"), "metadata": {**trainjob("6")["metadata"], "uid": "u-2"}},
                None,
            ),
            "replaced",
        ),
        (
            WatchView(
                True,
                "MODIFIED",
                {
                    **trainjob("6"),
                    "metadata": {
                        **trainjob("6")["metadata"],
                        "deletionTimestamp": "2026-12-03T12:00:00Z",
                    },
                },
                None,
            ),
            "being deleted",
        ),
        (
            WatchView(
                True,
                "MODIFIED",
                {
                    **trainjob("6"),
                    "metadata": {**trainjob("6")["metadata"], "ownerReferences": [{"uid": "x"}]},
                },
                None,
            ),
            "re-owned",
        ),
        (
            WatchView(False, "MODIFIED", trainjob("6"), "the watch ended with an error: gone"),
            "ended",
        ),
        (WatchView(False, None, None, None), "empty"),
    ],
)
def test_a_watch_that_cannot_serve_falls_back_to_a_paused_get(view: WatchView, why: str) -> None:
    clock = Clock()
    core = plain_core(clock)
    tries = iter([conflict(), conflict(), None])
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        lambda send: trainjob("5") if send.http.method == "GET" else next(tries),
        watch_serving(view),
    )
    assert steps[-1] is None, (why, steps[-1])
    # Each retry after the watch failed reads with a GET after a pause; the watch is not
    # asked again in this call.
    assert len([s for s in steps if isinstance(s, OpenWatch)]) == 1
    assert len([s for s in steps if isinstance(s, NextChange)]) == 1
    assert len(sends(steps, "GET")) == 3 and len([s for s in steps if isinstance(s, Pause)]) == 2


def test_a_watch_not_yet_past_the_conflicted_read_is_not_decided_on() -> None:
    clock = Clock()
    core = plain_core(clock)
    tries = iter([conflict(), None])
    versions = iter(["5", "6"])
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        lambda send: trainjob(next(versions)) if send.http.method == "GET" else next(tries),
        watch_serving(WatchView(False, "MODIFIED", trainjob("5"), None)),
    )
    assert steps[-1] is None
    # The watch still showed resourceVersion 5 (the write that beat us not seen yet): a
    # write on it would certainly conflict, so the retry read with a GET instead.
    assert written_versions(steps) == [
        "5",
        "6",
    ]


@pytest.mark.parametrize(
    "failure",
    [ApiStatusError(403, "Forbidden", "{}"), NoAnswer("t"), NotConnected("x"), ConnectionLost("r")],
)
def test_a_watch_refused_or_unanswered_falls_back_and_the_call_still_ends(
    failure: DriverError,
) -> None:
    clock = Clock()
    core = plain_core(clock)
    tries = iter([conflict(), None])
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        lambda send: trainjob("5") if send.http.method == "GET" else next(tries),
        lambda step: failure,
    )
    assert steps[-1] is None, (failure, steps[-1])
    assert len(sends(steps, "GET")) == 2 and len(sends(steps, "PATCH")) == 2


def test_no_watch_is_opened_without_time_to_wait_for_a_write() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=2 * CHANGE_WAIT_S), 1), "r"),
        lambda send: trainjob() if send.http.method == "GET" else conflict(),
        watch_serving(),
    )
    assert isinstance(steps[-1], Conflict)
    assert not [s for s in steps if isinstance(s, OpenWatch | NextChange)]


def test_the_deadline_is_checked_before_the_watch_is_sent() -> None:
    clock = Clock()
    core = plain_core(clock)

    def answer(send: Send) -> Answer:
        if send.http.method == "GET":
            return trainjob()
        clock.now = NOW + timedelta(seconds=11)  # the 409 came after the deadline
        return conflict()

    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"), answer, watch_serving()
    )
    assert isinstance(steps[-1], DeadlinePassed)
    assert not [s for s in steps if isinstance(s, OpenWatch)]


# ---- the watch feed ---------------------------------------------------------------------


def event(kind: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": trainjob(rv)}).encode() + b"\n"


def test_the_feed_keeps_the_newest_object_event_and_counts_them() -> None:
    feed = WatchFeed()
    assert feed.feed(event("ADDED", "1") + event("MODIFIED", "2")) == 2
    assert feed.feed(b'{"type": "BOOKMARK", "object": {"metadata": {}}}\n') == 0
    assert feed.events == 2 and feed.newest_type == "MODIFIED"
    assert feed.newest is not None and feed.newest["metadata"]["resourceVersion"] == "2"
    assert feed.ended is None


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (
            b'{"type": "ERROR", "object": {"message": "too old resource version"}}\n',
            "too old resource version",
        ),
        (b"<html>\n", "not JSON"),
        (b"x" * (4 * 1024 * 1024 + 1), "longer than"),
    ],
)
def test_the_feed_ends_on_an_error_event_garbage_or_a_huge_line(data: bytes, words: str) -> None:
    feed = WatchFeed()
    feed.feed(event("ADDED", "1"))
    feed.feed(data)
    assert feed.ended is not None and words in feed.ended
    assert feed.feed(event("MODIFIED", "9")) == 0  # nothing after the end counts
    assert feed.newest is not None and feed.newest["metadata"]["resourceVersion"] == "1"


@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_property_the_feed_parses_the_same_events_however_the_stream_is_split(
    cuts: list[int],
) -> None:
    stream = b"".join(event(k, str(i)) for i, k in enumerate(["ADDED", "MODIFIED", "DELETED"]))
    feed = WatchFeed()
    offsets = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *offsets], [*offsets, len(stream)], strict=True)]
    assert sum(feed.feed(piece) for piece in pieces) == 3
    assert feed.events == 3 and feed.newest_type == "DELETED" and feed.ended is None


# ---- Kueue mode: the two reads go out at once ---------------------------------------------


def kueue_core(clock: Clock) -> Core:
    core = plain_core(clock)
    core.context.mode = "kueue"
    core.context.workloads[REF] = ("u-1", "wl")  # the Workload found on an earlier call
    return core


def workload(rv: str = "7", owner: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "wl",
            "namespace": REF.namespace,
            "uid": "w-1",
            "resourceVersion": rv,
            "ownerReferences": [
                {"uid": owner, "controller": True, "kind": "TrainJob", "name": REF.name}
            ],
        },
        "spec": {"active": True},
    }


RUNTIME = {"kind": "ClusterTrainingRuntime", "metadata": {"name": "torch"}}


def by_path(
    tj: Answer, wl: Answer, listed: Answer = None, runtime: Answer = RUNTIME
) -> Callable[[Send], Answer]:
    def answer(send: Send) -> Answer:
        if send.http.method == "PATCH":
            return None
        if send.http.path.endswith("/trainjobs/llm"):
            return tj
        if send.http.path.endswith("/workloads/wl"):
            return wl
        if send.http.path.endswith("/clustertrainingruntimes/torch"):
            return runtime
        return listed

    return answer


def test_a_kueue_hold_reads_the_trainjob_and_its_cached_workload_at_once() -> None:
    clock = Clock()
    core = kueue_core(clock)
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        by_path(trainjob(), workload("7")),
    )
    assert steps[-1] is None, steps[-1]
    kinds = [type(step).__name__ for step in steps[:-1]]
    # Both hooks and deadline checks first, then both GETs in one step, then the PATCH.
    # The TrainJob runs, so its runtime is read (GET) before the write: Kueue could not
    # suspend it without one.
    assert kinds == [
        "BeforeRequest",
        "BeforeRequest",
        "SendAll",
        "BeforeRequest",
        "Send",
        "BeforeRequest",
        "Send",
    ]
    pair = steps[2]
    assert [s.http.path.rsplit("/", 2)[-2:] for s in pair.sends] == [
        ["trainjobs", "llm"],
        ["workloads", "wl"],
    ]
    assert all(0 < s.timeout <= 10 for s in pair.sends)
    assert steps[4].http.path.endswith("/clustertrainingruntimes/torch")
    assert written_versions(steps) == ["7"]
    assert core.context.request_count == 4


def test_a_kueue_hold_of_a_suspended_trainjob_reads_no_runtime() -> None:
    clock = Clock()
    core = kueue_core(clock)
    stopped = trainjob()
    stopped["spec"]["suspend"] = True  # Kueue need not write it: nothing to refuse
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        by_path(stopped, workload("7"), runtime=ApiStatusError(404, "Not Found", "{}")),
    )
    assert steps[-1] is None, steps[-1]
    assert not [s for s in sends(steps, "GET") if "runtimes" in s.http.path]
    assert written_versions(steps) == ["7"]


@pytest.mark.parametrize(
    ("runtime", "written"),
    [
        (ApiStatusError(404, "Not Found", "{}"), []),
        # Not allowed to read runtimes: only a runtime seen missing stops the Hold.
        (ApiStatusError(403, "Forbidden", '{"message": "no"}'), ["7"]),
    ],
    ids=["gone", "unreadable"],
)
def test_a_kueue_hold_of_a_running_trainjob_whose_runtime_is_gone_writes_nothing(
    runtime: Answer, written: list[str]
) -> None:
    clock = Clock()
    core = kueue_core(clock)
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        by_path(trainjob(), workload("7"), runtime=runtime),
    )
    assert written_versions(steps) == written
    if written:
        assert steps[-1] is None, steps[-1]
    else:
        error = steps[-1]
        assert isinstance(error, RuntimeMissing), error
        assert error.runtime == "ClusterTrainingRuntime torch", error.runtime
        for words in ("hold team-a/llm instance 1", "ClusterTrainingRuntime torch"):
            assert words in str(error), str(error)


@pytest.mark.parametrize(
    ("tj", "wl", "error", "words"),
    [
        # The TrainJob's error comes first, whatever the Workload's answer was.
        (ApiStatusError(404, "Not Found", "{}"), workload(), NotFound, "not found"),
        (NotConnected("refused"), workload(), Unreachable, "get trainjobs llm: not sent"),
        (NoAnswer("t"), ApiStatusError(404, "Not Found", "{}"), Rejected, "may still land"),
        (trainjob(), NotConnected("refused"), Unreachable, "get workloads wl: not sent"),
        (trainjob(), ApiStatusError(403, "Forbidden", '{"message": "no"}'), Rejected, "no"),
    ],
)
def test_a_failed_read_of_the_pair_is_the_trainjobs_error_first(
    tj: Answer, wl: Answer, error: type[AdapterError], words: str
) -> None:
    clock = Clock()
    core = kueue_core(clock)
    steps = drive(core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"), by_path(tj, wl))
    assert type(steps[-1]) is error and words in str(steps[-1]), steps[-1]
    assert not sends(steps, "PATCH")


@pytest.mark.parametrize(
    "wl",
    [ApiStatusError(404, "Not Found", "{}"), workload(owner="u-old")],
    ids=["gone", "not-this-trainjobs"],
)
def test_a_cached_workload_gone_or_not_the_trainjobs_is_rediscovered(wl: Answer) -> None:
    clock = Clock()
    core = kueue_core(clock)
    fresh = {**workload("9"), "metadata": {**workload("9")["metadata"], "name": "wl2"}}
    steps = drive(
        core.hold(REF, CallMeta(NOW + timedelta(seconds=10), 1), "r"),
        by_path(trainjob(), wl, listed={"items": [fresh]}),
    )
    assert steps[-1] is None, steps[-1]
    listed = [s for s in steps if isinstance(s, Send) and "labelSelector" in dict(s.http.query)]
    assert len(listed) == 1
    assert written_versions(steps) == ["9"] and core.context.workloads[REF] == ("u-1", "wl2")


# ---- plain-mode Release: the pod check carries over a status write ------------------------


def held_opened(rv: str, *, generation: int = 4, suspend: bool = True) -> dict[str, Any]:
    """An opened plain-mode TrainJob under hold instance 1, as the API server returns it."""
    obj = trainjob(
        rv,
        {
            "holdwarden.io/hold-instance": "1",
            "holdwarden.io/hold-reason": "r",
            "holdwarden.io/held-at": "2026-12-03T11:00:00Z",
            "holdwarden.io/held-by": "dispatch",
            "holdwarden.io/opened": "2026-12-03T10:00:00Z",
            "holdwarden.io/attempt": "1",
        },
    )
    obj["metadata"]["generation"] = generation
    obj["spec"]["suspend"] = suspend
    return obj


def plain_release_answers(
    tries: list[Answer], *reads: dict[str, Any], pods: list[Any] | None = None
) -> Callable[[Send], Answer]:
    """GET: the next of ``reads`` (the last one again once they run out); the pods LIST:
    the next of ``pods`` (default: no pod, every time); each PATCH: the next of ``tries``."""
    left, got, listed = iter(tries), list(reads), iter(pods or [])

    def answer(send: Send) -> Answer:
        if send.http.method == "PATCH":
            return next(left)
        if send.http.path.endswith("/pods"):
            return next(listed) if pods else {"items": []}
        return got.pop(0) if len(got) > 1 else got[0]

    return answer


def pod_lists(steps: list[Any]) -> list[Send]:
    return [s for s in sends(steps, "GET") if s.http.path.endswith("/pods")]


def test_a_plain_release_retried_after_a_status_write_lists_the_pods_once() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        plain_release_answers([conflict(), conflict(), None], held_opened("5")),
        watch_serving(
            WatchView(True, "MODIFIED", held_opened("6"), None),  # a status write: same gen
            WatchView(True, "MODIFIED", held_opened("7"), None),
        ),
    )
    assert isinstance(steps[-1], ReleaseResult), steps[-1]
    # One pod check, after the first read; the retries write at once on the watch's state.
    assert len(pod_lists(steps)) == 1
    assert steps.index(pod_lists(steps)[0]) < steps.index(sends(steps, "PATCH")[0])
    assert written_versions(steps) == ["5", "6", "7"]
    assert all((p.http.body or {}).get("spec") == {"suspend": False} for p in sends(steps, "PATCH"))
    assert [r.verb for r in core.context.request_log] == [
        "get",
        "list",
        "update",
        "watch",
        "update",
        "update",
    ]


def test_a_pod_check_carries_over_to_a_retry_that_reads_with_a_get() -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        plain_release_answers([conflict(), None], held_opened("5")),
        lambda step: ApiStatusError(403, "Forbidden", "{}"),  # retries read with GETs
    )
    assert isinstance(steps[-1], ReleaseResult), steps[-1]
    assert len(pod_lists(steps)) == 1  # the same read both times: carried over


@pytest.mark.parametrize(
    ("retry_read", "why"),
    [
        (held_opened("6", generation=6), "the spec changed in between"),
        (
            {**held_opened("6"), "metadata": {**held_opened("6")["metadata"], "uid": "u-2"}},
            "another TrainJob of that name",
        ),
        (
            {
                **held_opened("6"),
                "metadata": {
                    k: v for k, v in held_opened("6")["metadata"].items() if k != "generation"
                },
            },
            "no generation to compare",
        ),
    ],
)
def test_a_plain_release_lists_the_pods_again_unless_the_trainjob_stayed_suspended(
    retry_read: dict[str, Any], why: str
) -> None:
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        plain_release_answers([conflict(), None], held_opened("5"), retry_read),
    )
    assert isinstance(steps[-1], ReleaseResult), (why, steps[-1])
    assert len(pod_lists(steps)) == 2, why
    # Each pod check lies between the read it follows and the write decided on that read.
    # (The watch is refused here: the retry reads with a GET.)
    verbs = [r.verb for r in core.context.request_log if r.verb != "watch"]
    assert verbs == ["get", "list", "update"] * 2


def test_a_retry_that_finds_a_pod_after_the_spec_changed_writes_nothing() -> None:
    """Unsuspended and suspended again between the tries (the generation moved), a pod
    appeared: the retry lists again, sees it, and refuses; the check did not carry over."""
    clock = Clock()
    core = plain_core(clock)
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        plain_release_answers(
            [conflict()],
            held_opened("5"),
            held_opened("8", generation=6),
            pods=[{"items": []}, {"items": [{"metadata": {"name": "llm-node-0"}}]}],
        ),
    )
    assert type(steps[-1]).__name__ == "PodsRemain", steps[-1]
    assert len(sends(steps, "PATCH")) == 1


# ---- the steps' types hold: every step is yielded through its typed helper -----------------


def test_the_operations_yield_steps_only_through_the_typed_helpers() -> None:
    """An ``Operation`` resumes a bare ``yield`` with ``object``; the helpers in
    ``holdwarden.adapter.steps`` say what each step resumes with, so mypy checks every use
    of a step's result only while the operations never yield a step themselves."""
    root = Path(__file__).resolve().parents[2] / "adapter"
    modules = [*sorted((root / "operations").glob("*.py")), root / "preflight.py"]
    bare = [
        f"{path.relative_to(root.parent)}:{node.lineno}"
        for path in modules
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Yield)
    ]
    assert len(modules) > 10 and not bare, bare
