"""Read, decide, write: the loop Open, Hold and Release share, with its retries.

Invariants kept here (the spec's and issue 11's):

- Every write is a merge PATCH of only what the decision changed (``holdwarden.adapter.patches``),
  carrying the read's ``metadata.resourceVersion``: the API server refuses it (409) if anything
  changed since, exactly as it would a PUT of the object as read.
- A call retries at most ``MAX_RETRIES`` (8) times after its first try, then ``Conflict``.
  A retry reads the object from a watch opened at the first conflict, as soon as the next
  write of the object arrives (``read_after_change``); the read is still the object at
  one resourceVersion, and the write still carries exactly that resourceVersion.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta

from holdwarden import objects
from holdwarden.adapter import patches, steps, traps
from holdwarden.adapter.decisions import Decision, Obj, Outcome
from holdwarden.adapter.errors import (
    Conflict,
    DeadlinePassed,
    Invalid,
    PodsRemain,
    Rejected,
    RuntimeMissing,
    StaleHold,
)
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.workloads import forget_workload
from holdwarden.adapter.steps import (
    FIELD_MANAGER,
    ApiStatusError,
    DriverError,
    Http,
    OpenWatch,
    Operation,
    Request,
    WatchHandle,
    api_message,
    custom_path,
    error_for,
)
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Resource

MAX_RETRIES = 8

CONFLICT_BACKOFF_BASE_S = 0.002
CONFLICT_BACKOFF_CAP_S = 0.025
CHANGE_WAIT_S = 0.05
"""After a conflict, how long a retry waits for the object's next write (on its watch)
before it decides on the newest state it has: a writer at 20 Hz or faster is caught."""
WATCH_LIFETIME_CAP_S = 60
WATCH_OPEN_S = 1.0
WATCH_OPEN_SHARE = 0.1
"""A retry's watch gets its response headers and first event within WATCH_OPEN_S, and
within WATCH_OPEN_SHARE of the call's remaining time, whichever is less; otherwise the
retries fall back to paused GETs. A healthy apiserver answers a watch in milliseconds; an
intermediary that buffers streamed responses (some gateways and auth proxies) answers it
only when the watch ends, and without a bound of its own the watch cost a conflicted call
its whole deadline where a GET retry takes milliseconds."""


def conflict_backoff(attempt: int, draw: float) -> float:
    """Seconds to pause before retry ``attempt`` (1-based) after a conflict: uniform in
    [0, min(base * 2**attempt, cap)), with ``draw`` uniform in [0, 1).

    Why: the writers that make conflicts are mostly periodic (controllers' status
    heartbeats). Retrying at once keeps each try at the same phase of such a writer, so one
    conflict predicts the next: a 50 Hz writer made runs of nine. A random pause, a few
    milliseconds and growing, decorrelates the tries; a conflict-free call never pauses.
    (client-go's ``retry.RetryOnConflict`` pauses ~10 ms between tries for the same reason.)
    """
    if attempt < 1:
        return 0.0
    ceiling: float = min(CONFLICT_BACKOFF_BASE_S * 2.0**attempt, CONFLICT_BACKOFF_CAP_S)
    return ceiling * min(max(draw, 0.0), 1.0)


class _ConflictError(Exception):
    """A write met a resourceVersion conflict (HTTP 409)."""


class _Follow:
    """One call's watch of the object it writes, for its retries (see read_after_change)."""

    __slots__ = ("unusable", "watch")

    def __init__(self) -> None:
        self.watch: WatchHandle | None = None
        self.unusable = False


def read_decide_write(
    ctx: Context,
    resource: Resource,
    read: Callable[[], Operation[Obj]],
    decide: Callable[[Obj], Operation[Decision]],
    deadline: datetime,
    what: str,
    on_conflict: Callable[[Obj], None] | None = None,
) -> Operation[None]:
    """The loop Open, Hold and Release share: read, decide (purely), and write the
    decision preconditioned on the resourceVersion of that read; on a conflict (409),
    read and decide again, at most ``1 + MAX_RETRIES`` tries in all.

    Invariant: every write carries the resourceVersion of the very read it was decided
    on, so a write decided on a stale object can never land.

    How a retry reads: from a watch on the object, opened at the first conflict, as
    soon as the object's next write arrives (``read_after_change``). Why: the writers
    that beat a call are status writers, often periodic, and the window a write must
    fit in runs from its read to the API server's commit (tens of milliseconds on a
    busy node). A read taken the moment a write arrived has the whole gap to the next
    one; a GET at a random moment has on average half of it, so under a 50 Hz writer
    most GET-based tries lost. When the watch cannot serve (not allowed, ended, the
    object replaced), the retry pauses ``conflict_backoff`` and reads as the first try.
    """
    follow = _Follow()
    conflicted: Obj | None = None
    for attempt in range(1 + MAX_RETRIES):
        obj: Obj | None = None
        if conflicted is not None:
            obj = yield from read_after_change(ctx, resource, conflicted, follow, deadline)
            if obj is None:
                pause = conflict_backoff(attempt, ctx.random.random())
                if ctx.clock() + timedelta(seconds=pause) < deadline:
                    yield from steps.pause(pause)
        if obj is None:
            obj = yield from read()
        decision = yield from decide(obj)
        if decision.outcome is not Outcome.WRITE:
            settle(decision, what)
            return
        try:
            yield from write(ctx, resource, obj, decision, deadline, what)
            return
        except _ConflictError:
            conflicted = obj
            if on_conflict is not None:
                on_conflict(obj)
    raise Conflict(f"{what}: {1 + MAX_RETRIES} tries met conflicts")


def settle(decision: Decision, what: str) -> None:
    """Turn a decision that writes nothing into a return or the matching error."""
    if decision.outcome is Outcome.DONE:
        return
    message = f"{what}: {decision.detail}"
    if decision.outcome is Outcome.STALE:
        raise StaleHold(message)
    if decision.outcome is Outcome.PODS_REMAIN:
        raise PodsRemain(message)
    if decision.outcome is Outcome.INVALID:
        raise Invalid(message)
    raise Rejected(message)


def write(
    ctx: Context, resource: Resource, read: Obj, decision: Decision, deadline: datetime, what: str
) -> Operation[None]:
    """Write the decision: the merge patch from ``read`` to the decided body, carrying
    the read's metadata.resourceVersion (the precondition: 409 if the object moved on,
    exactly as a PUT of the object as read would be). Sent as one PATCH; only the
    changed fields travel (a few hundred bytes instead of the whole object)."""
    body = decision.body
    assert body is not None
    meta = read["metadata"]
    patch = patches.write_patch(read, body)  # ValueError: no resourceVersion to keep
    req = Request("update", resource.plural, meta["namespace"], meta["name"])
    http = Http(
        "PATCH",
        custom_path(resource, meta["namespace"], meta["name"]),
        query=(("fieldManager", FIELD_MANAGER),),
        body=patch,
        content_type="application/merge-patch+json",
        decode=False,  # nothing reads the answer: spare the decode
    )
    try:
        yield from ctx.send(req, deadline, http)
    except ApiStatusError as exc:
        if exc.status == 409:
            raise _ConflictError() from exc
        refusal = api_message(exc)
        runtime = traps.runtime_of(read) if resource is TRAINJOB else None
        name = runtime.name if runtime is not None else None
        if resource is TRAINJOB and traps.is_runtime_refusal(exc.status, refusal, name):
            raise RuntimeMissing(
                traps.runtime_missing_message(what, runtime, refusal),
                str(runtime) if runtime is not None else "",
            ) from exc
        if exc.status == 404 and resource is WORKLOAD:
            forget_workload(ctx, meta["namespace"], meta["name"])
        raise error_for(exc, what) from exc


def read_after_change(
    ctx: Context, resource: Resource, conflicted: Obj, follow: _Follow, deadline: datetime
) -> Operation[Obj | None]:
    """The object for a retry after ``conflicted`` met a conflict: from the call's
    watch (opened now if this is the first conflict), the first write that arrives
    within ``CHANGE_WAIT_S``, else the newest state the watch has. None when the watch
    cannot serve this retry: the caller then reads with its own GETs.

    Invariant: what it returns is the object exactly as the API server sent it at one
    resourceVersion, newer than ``conflicted``'s, with the same uid and
    ownerReferences, not being deleted; anything else (deleted, replaced, re-owned,
    not yet moved on) goes to the caller's read, which knows what each case means.
    """
    if follow.unusable:
        return None
    remaining = (deadline - ctx.clock()).total_seconds()
    if remaining <= 2 * CHANGE_WAIT_S:
        return None  # no time to wait for a write: a GET is the quickest read
    if follow.watch is None:
        follow.watch = yield from _open_watch(ctx, resource, conflicted, deadline)
        if follow.watch is None:
            follow.unusable = True
            return None
    view = yield from steps.next_change(follow.watch, CHANGE_WAIT_S)
    obj = view.obj
    if view.ended is not None or obj is None or view.event_type == "DELETED":
        follow.unusable = True
        return None
    if not objects.same_identity(conflicted, obj) or objects.is_deleting(obj):
        follow.unusable = True
        return None
    if objects.resource_version(obj) == objects.resource_version(conflicted):
        return None  # the watch has not seen the write that beat us yet
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj


def _open_watch(
    ctx: Context, resource: Resource, conflicted: Obj, deadline: datetime
) -> Operation[WatchHandle | None]:
    """Open a watch of the one object ``conflicted`` is (field selector on its name),
    from its current state, living at most until the deadline; None if the API server
    would not serve one (e.g. no ``watch`` right: the retries then use GETs). The
    deadline is checked before it is sent, as for every request."""
    meta = conflicted["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    req = Request("watch", resource.plural, namespace, name)
    yield from steps.before(req)
    remaining = (deadline - ctx.clock()).total_seconds()
    if remaining <= 0:
        raise DeadlinePassed(f"deadline passed before watch {resource.plural} {name}: not sent")
    lifetime = min(math.ceil(remaining), WATCH_LIFETIME_CAP_S)
    http = Http(
        "GET",
        custom_path(resource, namespace),
        query=(
            ("watch", "true"),
            ("fieldSelector", f"metadata.name={name}"),
            ("timeoutSeconds", str(lifetime)),
        ),
    )
    timeout = min(
        ctx.config.apiserver_request_timeout.total_seconds(),
        WATCH_OPEN_S,
        remaining * WATCH_OPEN_SHARE,
    )
    ctx.log(req, timeout)
    try:
        return (
            yield from steps.open_watch(OpenWatch(req, http, max(timeout, 0.001), lifetime + 1.0))
        )
    except DriverError:
        return None
