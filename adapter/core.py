"""The adapter's operations with no I/O in them: the part the sync and asyncio adapters share.

Each operation (Start, Open, Hold, Release, Observe, Preflight) is a generator. It yields *steps*
(``holdwarden.adapter.steps``: send a request, send several at once, pause, open a watch, wait for
its next change) and is resumed with their results. Preflight's probes are their own module
(``holdwarden.adapter.preflight``); the core caches their result and decides when they run.

A driver (``holdwarden.adapter.kube.Adapter`` on the kubernetes client,
``holdwarden.adapter.aio.AsyncAdapter`` on aiohttp) only runs steps: it decides nothing and maps no
error. So the deadline checks, the request timeouts, the retry loop, the error classes and their
messages, the caches and the request log exist once, here, for both.

Invariants kept here (the spec's and issue 11's):

- Every write is a merge PATCH of only what the decision changed (``holdwarden.adapter.patches``),
  carrying the read's ``metadata.resourceVersion``: the API server refuses it (409) if anything
  changed since, exactly as it would a PUT of the object as read.
- For a hold-family call, the deadline is checked immediately before every request (a
  passed deadline → ``DeadlinePassed``, nothing sent) and bounds the request's timeout:
  ``min(deadline - now, timeouts.apiserverRequest)``.
- A request that could not connect raises ``Unreachable`` (nothing sent); one that was sent
  and timed out or lost its connection says it may still land within ``call_bound``.
- A call retries at most ``MAX_RETRIES`` (8) times after its first try, then ``Conflict``.
  A retry reads the object from a watch opened at the first conflict, as soon as the next
  write of the object arrives (``_read_after_change``); the read is still the object at
  one resourceVersion, and the write still carries exactly that resourceVersion.
- In Kueue mode no request the adapter sends writes ``spec.suspend``.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import quote

from holdwarden import objects
from holdwarden.adapter import decisions, patches, traps
from holdwarden.adapter.decisions import Decision, Obj, Outcome
from holdwarden.adapter.errors import (
    AdapterError,
    Conflict,
    DeadlinePassed,
    Invalid,
    NotFound,
    PodsRemain,
    Rejected,
    RuntimeMissing,
    StaleHold,
    Unreachable,
    Unsupported,
)
from holdwarden.adapter.preflight import Preflight
from holdwarden.adapter.steps import (
    FIELD_MANAGER,
    ApiStatusError,
    BeforeRequest,
    ConnectionLost,
    DriverError,
    Http,
    NextChange,
    NoAnswer,
    NotConnected,
    OpenWatch,
    Operation,
    Pause,
    Request,
    RequestHook,
    Send,
    SendAll,
    WatchView,
    api_message,
    custom_path,
    error_for,
    no_request,
)
from holdwarden.adapter.types import CallMeta, Observation, PreflightResult, Ref, ReleaseResult
from holdwarden.config import Config
from holdwarden.vocabulary import (
    JOBSET_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    Mode,
    Resource,
    check_hold_instance,
)

MAX_RETRIES = 8
CALL_BOUND_MARGIN = timedelta(seconds=5)
START_POLL_INTERVAL_S = 0.1
# While Start waits for Kueue to make the Workload, each poll GETs the names Kueue gives
# it; only every this many polls (about once a second) does it also LIST by label, for a
# Workload named otherwise, so waiting costs no LIST over the namespace ten times a second.
START_POLLS_PER_LIST = 10

Clock = Callable[[], datetime]

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


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _get_request(resource: Resource, namespace: str, name: str) -> tuple[Request, Http]:
    """The GET of one namespaced object, as the request log names it and as it is sent."""
    return (
        Request("get", resource.plural, namespace, name),
        Http("GET", custom_path(resource, namespace, name)),
    )


def _get_what(resource: Resource, namespace: str, name: str) -> str:
    return f"get {resource.kind} {namespace}/{name}"


def _got(answer: Any, resource: Resource, namespace: str, name: str, what: str) -> Obj:
    """The object a ``SendAll`` answer holds, or the error a lone GET of it would raise
    (``what`` names the call; empty: the GET itself)."""
    if isinstance(answer, ApiStatusError):
        raise error_for(answer, what or _get_what(resource, namespace, name)) from answer
    if isinstance(answer, AdapterError):
        raise answer
    obj: Obj = answer
    return obj


def _uid(obj: Obj) -> str:
    """The uid of an object the API server sent (it always has one)."""
    uid = objects.uid(obj)
    if uid is None:
        raise AdapterError(f"{objects.name(obj)}: the API server sent an object with no uid")
    return uid


def _live_workload_of(workload: Obj, uid: str) -> bool:
    """Whether ``workload`` is the Workload of the TrainJob with ``uid``: its controller
    ownerReference names that uid (the label alone is not enough), and it is not being
    deleted."""
    return objects.controlled_by(workload, uid) and not objects.is_deleting(workload)


class _ConflictError(Exception):
    """A write met a resourceVersion conflict (HTTP 409)."""


class _Follow:
    """One call's watch of the object it writes, for its retries (see _read_after_change)."""

    __slots__ = ("unusable", "watch")

    def __init__(self) -> None:
        self.watch: Any = None
        self.unusable = False


class AdapterCore:
    """Start, Open, Hold, Release, Observe and Preflight, as operations (see the module).

    ``clock``: returns the current aware datetime (tests inject one). ``before_request``:
    called with each ``Request`` just before its deadline check (tests use it to interleave
    other writers or move the clock between a read and a write).

    Preflight runs lazily, once per namespace, on the first Hold or Release there (bounded
    by that call's deadline), after that call's first read (so the call's own errors, e.g.
    a missing TrainJob, come first), and is cached per adapter; ``preflight(ns)`` runs it
    again and replaces the cached result, ``forget_preflight()`` drops it.
    ``lazy_preflight``: ``"full"`` (default) probes as ``preflight()`` does, including the
    dry-run creates; ``"access"`` asks only SelfSubjectAccessReviews (no ``create`` right
    needed: what the CLI's hold and release use).
    """

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        before_request: RequestHook | None = None,
        lazy_preflight: Literal["full", "access"] = "full",
    ) -> None:
        if lazy_preflight not in ("full", "access"):
            raise ValueError(f"lazy_preflight must be 'full' or 'access', got {lazy_preflight!r}")
        self.lazy_preflight = lazy_preflight
        self.config = config
        self.mode: Mode = config.mode
        self.annotations = Annotations(config.annotation_prefix)
        self._clock: Clock = clock or _utc_now
        self._hook = before_request
        self._lock = threading.Lock()
        self._request_count = 0
        self.request_log: deque[Request] = deque(maxlen=10_000)
        # ref -> (TrainJob uid, Workload name): spares the LIST of Workloads on every call.
        self._workloads: dict[Ref, tuple[str, str]] = {}
        self._preflights: dict[str, PreflightResult] = {}
        self._random = random.Random()  # the conflict backoff's draws
        self._probes = Preflight(config, self.annotations, self._clock, self._send)

    # ---- public properties -----------------------------------------------------------

    @property
    def call_bound(self) -> timedelta:
        """``timeouts.apiserverRequest`` + 5 s: how long after its deadline a call's last
        request may still commit (the margin covers clock skew and the etcd commit of a
        request that timed out at the API server)."""
        return self.config.apiserver_request_timeout + CALL_BOUND_MARGIN

    @property
    def request_count(self) -> int:
        """Requests sent so far (every verb, every call); the benchmark reads it."""
        return self._request_count

    def forget_preflight(self, namespace: str | None = None) -> None:
        """Drop the cached preflight of ``namespace`` (every namespace when None): the next
        Hold or Release there probes again (e.g. after RBAC or the enforcer changed)."""
        if namespace is None:
            self._preflights.clear()
        else:
            self._preflights.pop(namespace, None)

    # ---- the contract, as operations ---------------------------------------------------

    def _start(self, trainjob: dict[str, Any], meta: CallMeta) -> Operation[Ref]:
        """Create the TrainJob; in Kueue mode wait (bounded by the deadline) for its
        Workload, so every started object has one. On timeout the TrainJob stays created."""
        deadline = self._deadline(meta)
        config = self.config
        namespace = decisions.needs_namespace_for_start(
            trainjob, manage_jobs_without_queue_name=config.kueue_manage_jobs_without_queue_name
        )
        unlabelled_managed = False
        if namespace:
            labels = yield from self._namespace_labels(namespace, deadline)
            unlabelled_managed = config.kueue_managed_jobs_namespace_selector.matches(labels)
        try:
            body = decisions.validate_start_body(
                trainjob,
                mode=self.mode,
                annotations=self.annotations,
                kueue_manages_unlabelled=unlabelled_managed,
            )
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
        ref = Ref(body["metadata"]["namespace"], body["metadata"]["name"])
        req = Request("create", TRAINJOB.plural, ref.namespace, ref.name)
        http = Http(
            "POST",
            custom_path(TRAINJOB, ref.namespace),
            query=(("fieldManager", FIELD_MANAGER),),
            body=body,
        )
        try:
            created = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            if exc.status == 409:
                raise Rejected(f"start {ref}: a TrainJob of that name exists") from exc
            raise error_for(exc, f"start {ref}") from exc
        if self.mode == "plain":
            return ref
        uid = _uid(created)
        timed_out = (
            f"start {ref}: the TrainJob was created but its Workload did not appear before the"
            " deadline (is Kueue running and the queue-name label right?)"
        )
        polls = 0
        while True:
            polls += 1
            by_label = polls % START_POLLS_PER_LIST == 0
            try:
                workload = yield from self._discover_workload(ref, uid, deadline, by_label)
            except DeadlinePassed as exc:
                raise DeadlinePassed(timed_out) from exc
            if workload is not None:
                return ref
            remaining = (deadline - self._clock()).total_seconds()
            if remaining <= 0:
                raise DeadlinePassed(timed_out)
            yield Pause(min(START_POLL_INTERVAL_S, remaining))

    def _open(self, ref: Ref, meta: CallMeta) -> Operation[None]:
        """Mark the TrainJob opened (plain mode: and run it if it waits at its start gate)."""
        deadline = self._deadline(meta)
        what = f"open {ref}"

        def read() -> Operation[Obj]:
            return self._get(TRAINJOB, ref.namespace, ref.name, deadline, what)

        def decide(trainjob: Obj) -> Operation[Decision]:
            return no_request(
                decisions.decide_open(
                    trainjob, mode=self.mode, now=self._clock(), annotations=self.annotations
                )
            )

        yield from self._read_decide_write(TRAINJOB, read, decide, deadline, what)

    def _hold(self, ref: Ref, meta: CallMeta, reason: str) -> Operation[None]:
        """Place hold ``meta.instance`` (see the spec's conflict rules)."""
        deadline = self._deadline(meta)
        instance = self._instance(meta)
        if not isinstance(reason, str) or len(reason) > decisions.MAX_REASON_LENGTH:
            raise Invalid(f"reason must be text of at most {decisions.MAX_REASON_LENGTH} chars")
        what = f"hold {ref} instance {instance}"
        # What the last conflicted try read: decide_hold's conflict rules need it.
        conflicted: list[Obj] = []

        def decide(held: Obj) -> Operation[Decision]:
            return no_request(
                decisions.decide_hold(
                    held,
                    mode=self.mode,
                    instance=instance,
                    reason=reason,
                    holder=self.config.holder,
                    now=self._clock(),
                    annotations=self.annotations,
                    last_seen_instance=(
                        objects.hold_instance_text(conflicted[-1], self.annotations)
                        if conflicted
                        else None
                    ),
                    after_conflict=bool(conflicted),
                )
            )

        read = yield from self._held_reader(ref, deadline, what)
        yield from self._read_decide_write(
            self._held_resource, read, decide, deadline, what, on_conflict=conflicted.append
        )

    def _release(self, ref: Ref, meta: CallMeta) -> Operation[ReleaseResult]:
        """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force.

        Returns what the caller must know although the hold was lifted (``ReleaseResult``):
        in Kueue mode, a Workload Kueue itself had deactivated, which Kueue up to v0.19 will
        not queue again (``traps.requeue_blocked``). Kueue mode, before the first write: the
        TrainJob's runtime must exist (one GET), else ``RuntimeMissing`` and nothing is
        written, since Trainer's webhook would refuse Kueue's unsuspend and the gate's
        attempt raise; plain mode learns the same from the webhook's refusal of its write.
        """
        deadline = self._deadline(meta)
        instance = self._instance(meta)
        what = f"release {ref} instance {instance}"
        # The TrainJob of each read (Kueue mode: read beside the Workload) and the held
        # object of the last decision: Release's result is decided on the read it wrote on.
        trainjobs: list[Obj] = []
        decided: list[Obj] = []
        runtime_checked = False
        # The read the call's last pod check followed, when it found no pod. A retry whose
        # read proves the TrainJob stayed suspended since then writes without listing again
        # (decisions.pod_check_carries_over): under a busy status writer the LIST's round
        # trip between read and write is what made plain-mode Release lose most retries.
        no_pods_after: Obj | None = None

        def decide(held: Obj) -> Operation[Decision]:
            nonlocal no_pods_after, runtime_checked
            pods_remain: bool | None = None
            in_force = objects.hold_instance(held, self.annotations) == instance
            decided.append(held)
            if self.mode == "kueue" and in_force and not runtime_checked and trainjobs:
                runtime_checked = True
                yield from self._require_runtime(trainjobs[-1], deadline, what)
            if (
                self.mode == "plain"
                and in_force
                and decisions.release_would_unsuspend(held, self.annotations)
            ):
                if no_pods_after is not None and decisions.pod_check_carries_over(
                    no_pods_after, held
                ):
                    pods_remain = False
                else:
                    pods_remain = yield from self._pods_remain(ref, deadline)
                    no_pods_after = None if pods_remain else held
            return decisions.decide_release(
                held,
                mode=self.mode,
                instance=instance,
                annotations=self.annotations,
                pods_remain=pods_remain,
            )

        read = yield from self._held_reader(ref, deadline, what, trainjobs)
        yield from self._read_decide_write(self._held_resource, read, decide, deadline, what)
        blocked = traps.requeue_blocked(decided[-1]) if self.mode == "kueue" else None
        warnings: tuple[str, ...] = ()
        if blocked is not None:
            workload = objects.name(decided[-1]) or "?"
            warnings = (traps.stranded_advice(ref.namespace, workload, blocked),)
        return ReleaseResult(ref, instance, kueue_requeue_blocked=blocked, warnings=warnings)

    def _require_runtime(self, trainjob: Obj, deadline: datetime, what: str) -> Operation[None]:
        """Raise RuntimeMissing when the runtime the TrainJob names is not found (404).
        Any other answer (found, or a refusal of the GET: no right to read runtimes) lets
        the call go on: only a runtime seen missing stops it."""
        runtime = traps.runtime_of(trainjob)
        if runtime is None:
            return
        resource = runtime.resource
        req = Request("get", resource.plural, runtime.namespace or "", runtime.name)
        http = Http("GET", custom_path(resource, runtime.namespace, runtime.name))
        try:
            yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            if exc.status == 404:
                raise RuntimeMissing(
                    traps.runtime_missing_message(what, runtime, ""), str(runtime)
                ) from exc

    def _observe(self, ref: Ref) -> Operation[Observation]:
        """Classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""
        what = f"observe {ref}"
        trainjob = yield from self._get(TRAINJOB, ref.namespace, ref.name, None, what)
        workload: Obj | None = None
        if self.mode == "kueue":
            workload = yield from self._workload_for(ref, trainjob, None)
        observation = decisions.classify(
            trainjob, workload, mode=self.mode, annotations=self.annotations, ref=ref
        )
        pods, pods_error = yield from self._list_pods(ref)
        return replace(
            observation,
            leftover_pods=decisions.leftover_pods(observation.state, pods),
            pods_error=pods_error,
            kueue_requeue_blocked=traps.requeue_blocked(workload) if workload else None,
            workload_active=objects.active(workload) if workload else True,
        )

    def _preflight(self, namespace: str, refresh: bool) -> Operation[PreflightResult]:
        """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
        included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
        when there is one (which may come from the lighter lazy check)."""
        if not refresh:
            cached = self._preflights.get(namespace)
            if cached is not None:
                return cached
        result = yield from self._probes.run(namespace, None, scan=True)
        self._preflights[namespace] = result
        return result

    # ---- hold-family helpers ---------------------------------------------------------

    @property
    def _held_resource(self) -> Resource:
        return self._probes.held_resource

    def _deadline(self, meta: CallMeta) -> datetime:
        deadline = getattr(meta, "deadline", None)
        if not isinstance(deadline, datetime):
            raise Invalid("the call carries no deadline (CallMeta.deadline)")
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise Invalid("CallMeta.deadline must be timezone-aware, e.g. datetime.now(UTC)")
        if deadline <= self._clock():
            raise DeadlinePassed(f"the call's deadline {deadline.isoformat()} has passed")
        return deadline

    @staticmethod
    def _instance(meta: CallMeta) -> int:
        instance = meta.instance
        # The one bound (vocabulary.MAX_HOLD_INSTANCE), checked here, before any request:
        # an instance the enforcer and every parser would call malformed is never written.
        try:
            return check_hold_instance(instance)
        except ValueError as exc:
            raise Invalid(str(exc)) from exc

    def _first_read(
        self, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None = None
    ) -> Operation[Obj | None]:
        """A Hold's or Release's first read, then the capability check (cached preflight).

        The call's own errors come first: a missing TrainJob is NotFound, one without a
        Workload is Rejected, whatever preflight would say. A read the API server refused
        (403) is reported as Unsupported when preflight says Hold is not available here
        (that reason names the missing right), else as the refusal. Returns the object
        read, or None when preflight ran just now (it took time: the loop reads again, so
        the decision is made on a fresh read).
        """
        read_error: AdapterError | None = None
        held: Obj | None = None
        try:
            held = yield from self._read_held(ref, deadline, what, trainjobs)
        except Rejected as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ApiStatusError) and cause.status == 403):
                raise
            read_error = exc
        if (yield from self._require_hold(ref.namespace, deadline)):
            held = None
        if read_error is not None:
            raise read_error
        return held

    def _require_hold(self, namespace: str, deadline: datetime) -> Operation[bool]:
        """Raise Unsupported unless Hold is available in ``namespace``; True when the
        (lazy) preflight had to run for it now."""
        result = self._preflights.get(namespace)
        ran = result is None
        if result is None:
            if self.lazy_preflight == "access":
                result = yield from self._probes.run_access(namespace, deadline)
            else:
                result = yield from self._probes.run(namespace, deadline)
            self._preflights[namespace] = result
        if not result.hold_supported:
            raise Unsupported(result.hold_unsupported_reason or "unknown")
        return ran

    def _read_decide_write(
        self,
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
        soon as the object's next write arrives (``_read_after_change``). Why: the writers
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
                obj = yield from self._read_after_change(resource, conflicted, follow, deadline)
                if obj is None:
                    pause = conflict_backoff(attempt, self._random.random())
                    if self._clock() + timedelta(seconds=pause) < deadline:
                        yield Pause(pause)
            if obj is None:
                obj = yield from read()
            decision = yield from decide(obj)
            if decision.outcome is not Outcome.WRITE:
                self._settle(decision, what)
                return
            try:
                yield from self._write(resource, obj, decision, deadline, what)
                return
            except _ConflictError:
                conflicted = obj
                if on_conflict is not None:
                    on_conflict(obj)
        raise Conflict(f"{what}: {1 + MAX_RETRIES} tries met conflicts")

    def _read_after_change(
        self, resource: Resource, conflicted: Obj, follow: _Follow, deadline: datetime
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
        remaining = (deadline - self._clock()).total_seconds()
        if remaining <= 2 * CHANGE_WAIT_S:
            return None  # no time to wait for a write: a GET is the quickest read
        if follow.watch is None:
            follow.watch = yield from self._open_watch(resource, conflicted, deadline)
            if follow.watch is None:
                follow.unusable = True
                return None
        view: WatchView = yield NextChange(follow.watch, CHANGE_WAIT_S)
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
        self, resource: Resource, conflicted: Obj, deadline: datetime
    ) -> Operation[Any]:
        """Open a watch of the one object ``conflicted`` is (field selector on its name),
        from its current state, living at most until the deadline; None if the API server
        would not serve one (e.g. no ``watch`` right: the retries then use GETs). The
        deadline is checked before it is sent, as for every request."""
        meta = conflicted["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        req = Request("watch", resource.plural, namespace, name)
        yield BeforeRequest(req)
        remaining = (deadline - self._clock()).total_seconds()
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
            self.config.apiserver_request_timeout.total_seconds(),
            WATCH_OPEN_S,
            remaining * WATCH_OPEN_SHARE,
        )
        with self._lock:
            self._request_count += 1
            self.request_log.append(replace(req, timeout=timeout))
        try:
            return (yield OpenWatch(req, http, max(timeout, 0.001), lifetime + 1.0))
        except DriverError:
            return None

    def _held_reader(
        self, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None = None
    ) -> Operation[Callable[[], Operation[Obj]]]:
        """Reads of the held object for one call: the first is ``_first_read`` (which also
        checks preflight), every later one (after a conflict) ``_read_held``. With
        ``trainjobs``, the TrainJob of each read is appended to it."""
        first = yield from self._first_read(ref, deadline, what, trainjobs)

        def read() -> Operation[Obj]:
            nonlocal first
            obj, first = first, None
            if obj is not None:
                return obj
            return (yield from self._read_held(ref, deadline, what, trainjobs))

        return read

    def _settle(self, decision: Decision, what: str) -> None:
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

    def _read_held(
        self, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None = None
    ) -> Operation[Obj]:
        """Read the held object: the Workload (Kueue mode) or the TrainJob (plain mode).
        With ``trainjobs``, the TrainJob read is appended to it."""
        if self.mode == "plain":
            trainjob = yield from self._get(TRAINJOB, ref.namespace, ref.name, deadline, what)
            if trainjobs is not None:
                trainjobs.append(trainjob)
            return trainjob
        # The TrainJob is read too, every time: only its uid *now* tells whether the
        # cached Workload still belongs to it. A TrainJob deleted and started again under
        # the same name has a new uid, and until the garbage collector removes the old
        # Workload, trusting the cache would hold the dead job's Workload while the new job
        # runs. With the Workload's name cached, both GETs go out at once: a steady-state
        # Kueue-mode Hold costs one read's time, then the PATCH.
        cached = self._workloads.get(ref)
        workload: Obj | None = None
        if cached is None:
            trainjob = yield from self._get(TRAINJOB, ref.namespace, ref.name, deadline, what)
        else:
            trainjob, workload = yield from self._read_pair(ref, cached, deadline, what)
        if trainjobs is not None:
            trainjobs.append(trainjob)
        if workload is None:
            self._workloads.pop(ref, None)
            workload = yield from self._discover_workload(ref, _uid(trainjob), deadline)
        if workload is None:
            raise Rejected(f"{what}: the TrainJob has no Workload (not managed by Kueue yet?)")
        return workload

    def _read_pair(
        self, ref: Ref, cached: tuple[str, str], deadline: datetime, what: str
    ) -> Operation[tuple[Obj, Obj | None]]:
        """The TrainJob and its cached Workload, read at once. The TrainJob's error comes
        first (its absence is the call's NotFound). The Workload is None when it is gone,
        or no longer the cached TrainJob's (the caller rediscovers)."""
        namespace = ref.namespace
        tj_answer, wl_answer = yield from self._send_all(
            [
                _get_request(TRAINJOB, namespace, ref.name),
                _get_request(WORKLOAD, namespace, cached[1]),
            ],
            deadline,
        )
        trainjob = _got(tj_answer, TRAINJOB, namespace, ref.name, what)
        if isinstance(wl_answer, ApiStatusError) and wl_answer.status == 404:
            return trainjob, None
        workload = _got(wl_answer, WORKLOAD, namespace, cached[1], "")
        if cached[0] != _uid(trainjob) or not _live_workload_of(workload, cached[0]):
            return trainjob, None
        return trainjob, workload

    def _workload_for(
        self, ref: Ref, trainjob: Obj | None, deadline: datetime | None
    ) -> Operation[Obj | None]:
        """The TrainJob's Workload, from the cache (one GET) or by discovery.

        A cached Workload is used only if it still has a controller ownerReference to the
        cached TrainJob uid (and, when ``trainjob`` was read, that uid is the TrainJob's)
        and is not being deleted; otherwise the cache entry is dropped and rediscovered.
        """
        cached = self._workloads.get(ref)
        uid = _uid(trainjob) if trainjob is not None else None
        if cached is not None and (uid is None or cached[0] == uid):
            workload: Obj | None
            try:
                workload = yield from self._get(WORKLOAD, ref.namespace, cached[1], deadline, "")
            except NotFound:
                workload = None
            if workload is not None and _live_workload_of(workload, cached[0]):
                return workload
        self._workloads.pop(ref, None)
        if trainjob is None:
            trainjob = yield from self._get(TRAINJOB, ref.namespace, ref.name, deadline, f"{ref}")
            uid = _uid(trainjob)
        assert uid is not None
        return (yield from self._discover_workload(ref, uid, deadline))

    def _discover_workload(
        self, ref: Ref, uid: str, deadline: datetime | None, by_label: bool = True
    ) -> Operation[Obj | None]:
        """The live Workload the TrainJob with ``uid`` controls, or None; remembered for the
        next call.

        First a GET of each name Kueue gives it (``objects.kueue_workload_names``): its
        cost does not grow with the namespace, where the label-selected LIST makes the
        apiserver filter every Workload there (at 100,000 Workloads, 1,000 concurrent
        Holds' LISTs overran their deadlines). Only when no predicted name holds the
        TrainJob's Workload does the LIST run (unless ``by_label`` is false), so a Workload
        named otherwise (another Kueue version, workload slicing) is still found."""
        workload = yield from self._workload_by_kueue_name(ref, uid, deadline)
        if workload is None and by_label:
            workload = yield from self._workload_by_label(ref, uid, deadline)
        if workload is None:
            return None
        # A list response's items carry no apiVersion/kind; a write's body needs them.
        workload.setdefault("apiVersion", WORKLOAD.api_version)
        workload.setdefault("kind", WORKLOAD.kind)
        self._workloads[ref] = (uid, str(objects.name(workload)))
        return workload

    def _workload_by_kueue_name(
        self, ref: Ref, uid: str, deadline: datetime | None
    ) -> Operation[dict[str, Any] | None]:
        """The TrainJob's live Workload under a name Kueue would give it, or None. An API
        error of these GETs (404, or 403 for a role with ``list`` but not ``get``) is a
        miss for the LIST to settle; a transport failure or a passed deadline is the
        call's."""
        names = objects.kueue_workload_names(ref.name, uid)
        answers = yield from self._send_all(
            [_get_request(WORKLOAD, ref.namespace, name) for name in names], deadline
        )
        for answer in answers:
            if isinstance(answer, AdapterError):
                raise answer
            if isinstance(answer, dict) and _live_workload_of(answer, uid):
                return answer
        return None

    def _workload_by_label(
        self, ref: Ref, uid: str, deadline: datetime | None
    ) -> Operation[dict[str, Any] | None]:
        """List Workloads labelled job-uid=<uid> and keep the one the TrainJob controls."""
        req = Request("list", WORKLOAD.plural, ref.namespace)
        http = Http(
            "GET",
            custom_path(WORKLOAD, ref.namespace),
            query=(("labelSelector", objects.job_uid_selector(uid)),),
        )
        try:
            listed = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            raise error_for(exc, f"find the Workload of {ref}") from exc
        owned = [w for w in listed.get("items") or [] if _live_workload_of(w, uid)]
        if not owned:
            return None
        if len(owned) > 1:
            names = sorted(str(objects.name(w)) for w in owned)
            raise Rejected(f"{ref} has several Workloads {names}; refusing to guess")
        workload: dict[str, Any] = owned[0]
        return workload

    def _forget_workload(self, namespace: str, name: str) -> None:
        for ref, (_, cached) in list(self._workloads.items()):
            if ref.namespace == namespace and cached == name:
                self._workloads.pop(ref, None)

    @staticmethod
    def _pods_http(ref: Ref, *, limit: int | None = None) -> Http:
        query: tuple[tuple[str, str], ...] = (("labelSelector", f"{JOBSET_NAME_LABEL}={ref.name}"),)
        if limit is not None:
            query += (("limit", str(limit)),)
        return Http("GET", f"/api/v1/namespaces/{quote(ref.namespace, safe='')}/pods", query)

    def _list_pods(self, ref: Ref) -> Operation[tuple[list[Obj], str | None]]:
        """The TrainJob's pods, as plain dicts, or the reason they could not be listed.

        Observe reports, it does not fail: a supervisor without ``list pods`` still gets
        the state, and the reason the pod facts are missing.
        """
        req = Request("list", "pods", ref.namespace)
        try:
            listed = yield from self._send(req, None, self._pods_http(ref))
        except ApiStatusError as exc:
            return [], f"could not list the pods of {ref}: {api_message(exc)}"
        pods: list[Obj] = []
        for pod in listed.get("items") or []:
            pods.append(
                {
                    "name": objects.name(pod),
                    "deleting": objects.is_deleting(pod),
                    "phase": (pod.get("status") or {}).get("phase"),
                }
            )
        return pods, None

    def _pods_remain(self, ref: Ref, deadline: datetime) -> Operation[bool]:
        req = Request("list", "pods", ref.namespace)
        try:
            listed = yield from self._send(req, deadline, self._pods_http(ref, limit=1))
        except ApiStatusError as exc:
            raise error_for(exc, f"list the pods of {ref}") from exc
        return bool(listed.get("items"))

    # ---- requests --------------------------------------------------------------------

    def _namespace_labels(self, namespace: str, deadline: datetime) -> Operation[dict[str, str]]:
        """The labels of Namespace ``namespace`` (Start's question: does Kueue manage a
        TrainJob without a queue name there?)."""
        req = Request("get", "namespaces", "", namespace)
        http = Http("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}")
        try:
            found: Obj = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            raise error_for(
                exc,
                f"start: reading Namespace {namespace} (kueue.manageJobsWithoutQueueName is true,"
                " so whether Kueue manages a TrainJob without the queue-name label depends on"
                " its labels; grant get on namespaces, or add the label)",
            ) from exc
        labels = (found.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    def _get(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        deadline: datetime | None,
        what: str,
    ) -> Operation[Obj]:
        req, http = _get_request(resource, namespace, name)
        try:
            obj: Obj = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            raise error_for(exc, what or _get_what(resource, namespace, name)) from exc
        return obj

    def _write(
        self, resource: Resource, read: Obj, decision: Decision, deadline: datetime, what: str
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
            yield from self._send(req, deadline, http)
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
                self._forget_workload(meta["namespace"], meta["name"])
            raise error_for(exc, what) from exc

    def _send(self, req: Request, deadline: datetime | None, http: Http) -> Operation[Any]:
        """Send one request: hook, deadline check, bounded timeout, count, then the step;
        a driver's transport failure becomes the adapter's error, with what it means for
        whether the request can still land. An ``ApiStatusError`` passes through."""
        limit = yield from self._prepare(req, deadline)
        try:
            return (yield Send(req, http, max(limit.total_seconds(), 0.001)))
        except (NotConnected, NoAnswer, ConnectionLost) as exc:
            raise self._transport_failure(req, deadline, limit, exc) from exc

    def _send_all(
        self, requests: list[tuple[Request, Http]], deadline: datetime | None
    ) -> Operation[list[Any]]:
        """Send ``requests`` at once, each prepared as ``_send`` prepares one (hook,
        deadline check, timeout, count). Returns, for each in order, its decoded answer,
        its ``ApiStatusError``, or the ``AdapterError`` its transport failure means."""
        sends: list[Send] = []
        limits: list[timedelta] = []
        for req, http in requests:
            limit = yield from self._prepare(req, deadline)
            limits.append(limit)
            sends.append(Send(req, http, max(limit.total_seconds(), 0.001)))
        answers = yield SendAll(tuple(sends))
        out: list[Any] = []
        for send, limit, answer in zip(sends, limits, answers, strict=True):
            if isinstance(answer, NotConnected | NoAnswer | ConnectionLost):
                failure = self._transport_failure(send.req, deadline, limit, answer)
                failure.__cause__ = answer
                out.append(failure)
            else:
                out.append(answer)
        return out

    def _prepare(self, req: Request, deadline: datetime | None) -> Operation[timedelta]:
        """The hook, then the deadline check (DeadlinePassed: not sent), then the count
        and the log; returns the request's time limit."""
        yield BeforeRequest(req)
        limit = self.config.apiserver_request_timeout
        if deadline is not None:
            remaining = deadline - self._clock()
            if remaining <= timedelta(0):
                raise DeadlinePassed(
                    f"deadline passed before {req.verb} {req.resource} {req.name}: not sent"
                )
            limit = min(limit, remaining)
        timeout = max(limit.total_seconds(), 0.001)
        with self._lock:
            self._request_count += 1
            self.request_log.append(replace(req, timeout=timeout))
        return limit

    def _transport_failure(
        self, req: Request, deadline: datetime | None, limit: timedelta, exc: DriverError
    ) -> AdapterError:
        """What a transport failure of ``req`` means for the caller, as its error."""
        if isinstance(exc, NotConnected):
            # No connection was made, so no byte of this request reached the API server.
            not_sent = f"{req.verb} {req.resource} {req.name}: not sent"
            if deadline is not None and self._clock() >= deadline:
                return DeadlinePassed(
                    f"{not_sent}: no connection to the API server before the deadline ({exc})"
                )
            return Unreachable(
                f"{not_sent}: cannot connect to the API server ({exc}); nothing of this"
                " request can land"
            )
        if isinstance(exc, NoAnswer):
            message = (
                f"{req.verb} {req.resource} {req.name}: sent, but no answer within"
                f" {limit.total_seconds():.3f}s (deadline or timeouts.apiserverRequest); it"
                f" may still land within call_bound ({self.call_bound.total_seconds():g}s"
                " after the deadline): place a new hold instance only after that"
            )
            # Cut off by the call's own deadline: the same outcome as a deadline that
            # passed before sending, so callers (Start's wait) can treat both alike.
            if deadline is not None and self._clock() >= deadline:
                return DeadlinePassed(message)
            return Rejected(message)
        # The connection was made and then lost (reset, closed mid-answer): the request
        # may have been received, so a write may still land, as after a timeout.
        return AdapterError(
            f"{req.verb} {req.resource} {req.name}: the connection to the API server was"
            f" lost after the request was sent ({exc}); it may still land within"
            f" call_bound ({self.call_bound.total_seconds():g}s after the deadline)"
        )
