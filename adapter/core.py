"""The adapter's operations with no I/O in them: the part the sync and asyncio adapters share.

Each operation (Start, Open, Hold, Release, Observe, Preflight) is a generator. It yields
*steps* and is resumed with their results:

- ``BeforeRequest(req)``: call the caller's ``before_request`` hook (tests interleave other
  writers there); resumed with nothing.
- ``Send(req, http, timeout)``: send one HTTP request and resume with its decoded JSON
  answer (None when ``http.decode`` is false), or throw one of the ``DriverError`` classes
  into the generator: ``ApiStatusError`` (a non-2xx answer), ``NotConnected`` (no byte was
  sent), ``NoAnswer`` (sent, then timed out), ``ConnectionLost`` (sent, then the connection
  broke).
- ``SendAll(sends)``: send several requests at once and resume with a tuple of their
  answers, each a decoded body or the ``DriverError`` it met (a Kueue-mode read sends its
  two GETs so).
- ``Pause(seconds)``: sleep (Start's wait for the Workload, a conflict's backoff).
- ``OpenWatch(req, http, timeout, lifetime)``: open a watch (a streaming GET) and resume,
  once its first event (the object's state now) came, with an opaque handle; or throw a
  ``DriverError`` as for ``Send``. The driver closes every watch when the operation ends.
- ``NextChange(watch, wait)``: wait up to ``wait`` seconds for an event that arrives after
  the step began, then resume with the watch's newest ``WatchView`` (fresh or not).

A driver (``adapter.kube.Adapter`` on the kubernetes client, ``adapter.aio.AsyncAdapter``
on aiohttp) only runs steps: it decides nothing and maps no error. So the deadline checks,
the request timeouts, the retry loop, the error classes and their messages, the caches and
the request log exist once, here, for both.

Invariants kept here (the spec's and issue 11's):

- Every write is a merge PATCH of only what the decision changed (``adapter.patches``),
  carrying the read's ``metadata.resourceVersion``: the API server refuses it (409) if
  anything changed since, exactly as it would a PUT of the object as read.
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

import json
import math
import random
import secrets
import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import msgspec

from adapter import decisions, patches
from adapter.decisions import Decision, Obj, Outcome
from adapter.errors import (
    AdapterError,
    Conflict,
    DeadlinePassed,
    Invalid,
    NotFound,
    PodsRemain,
    Rejected,
    StaleHold,
    Unreachable,
    Unsupported,
)
from adapter.types import CallMeta, Capability, Observation, PreflightResult, Ref
from holdwarden import objects
from holdwarden.config import Config
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    BREAK_GLASS_GROUP,
    CLUSTERQUEUE,
    CLUSTERTRAININGRUNTIME,
    JOB_UID_LABEL,
    JOBSET_NAME_LABEL,
    LOCALQUEUE,
    MULTIKUEUE_CONTROLLER,
    TRAININGRUNTIME,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    Mode,
    Resource,
    RuleId,
    check_hold_instance,
)

MAX_RETRIES = 8
# Every write is a merge PATCH (adapter/patches.py), so ``patch`` is the RBAC verb the
# supervisor needs on the held resource (and on TrainJobs for Open); preflight asks for it.
WRITE_VERB = "patch"
CALL_BOUND_MARGIN = timedelta(seconds=5)
FIELD_MANAGER = "holdwarden-adapter"
START_POLL_INTERVAL_S = 0.1
PROBE_RUNTIME_PLACEHOLDER = "holdwarden-preflight"

Clock = Callable[[], datetime]
T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One request the adapter is about to send (what the request log and hook see)."""

    verb: str  # get | list | create | update | dry-run-create | access-review | ...
    resource: str  # trainjobs | workloads | pods | selfsubjectaccessreviews | ...
    namespace: str
    name: str = ""
    timeout: float | None = None
    """Seconds the request was allowed (set in the request log once it is sent)."""


RequestHook = Callable[[Request], Any]
"""Called with each ``Request`` before its deadline check. The asyncio adapter awaits what
it returns when that is awaitable; the sync adapter ignores the return value."""


# ---- steps: what an operation asks its driver to do ---------------------------------------


@dataclass(frozen=True)
class Http:
    """One HTTP request to the API server, with a path relative to its host."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: Obj | None = None
    content_type: str = "application/json"
    decode: bool = True
    """False: the answer's body is not decoded (nothing reads it)."""


@dataclass(frozen=True)
class BeforeRequest:
    req: Request


@dataclass(frozen=True)
class Send:
    req: Request
    http: Http
    timeout: float
    """Seconds the whole request may take (connect, send, answer)."""


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class SendAll:
    """Send these requests at once (concurrently); resume with a tuple holding, for each
    in order, its decoded answer or the ``DriverError`` it met (never thrown in)."""

    sends: tuple[Send, ...]


@dataclass(frozen=True)
class OpenWatch:
    req: Request
    http: Http
    timeout: float
    """Seconds to connect, get the response headers and the first event (the object's
    state now), all together (``WATCH_OPEN_S``)."""
    lifetime: float
    """Seconds the stream may stay open at most (the read timeout between its events)."""


@dataclass(frozen=True)
class NextChange:
    watch: Any
    """The handle ``OpenWatch`` resumed with."""
    wait: float
    """Seconds to wait at most for an event that arrives after this step began."""


@dataclass(frozen=True)
class WatchView:
    """What a watch said so far: its newest event, and whether one came during the wait."""

    fresh: bool
    event_type: str | None
    obj: Obj | None
    ended: str | None
    """Why the stream ended (None while it is open)."""


WATCH_EVENT_MAX_BYTES = 4 * 1024 * 1024
"""A longer line is not an event of one object: the feed ends instead of buffering it."""


class WatchFeed:
    """The bytes of one watch stream, parsed: how many object events came, and the newest.

    Pure (no I/O, no lock): a driver feeds it what it reads, under its own lock or loop.
    It keeps only the newest event's object, so its memory is bounded by one object and
    ``WATCH_EVENT_MAX_BYTES`` of partial line, however long the stream runs.
    """

    def __init__(self) -> None:
        self.events = 0
        self.newest_type: str | None = None
        self.newest: Obj | None = None
        self.ended: str | None = None
        self._partial = b""

    def feed(self, data: bytes) -> int:
        """Parse ``data`` (any split of the stream); returns the object events it held."""
        if self.ended is not None:
            return 0
        *lines, self._partial = (self._partial + data).split(b"\n")
        parsed = 0
        for line in lines:
            if line.strip():
                parsed += self._event(line)
        if len(self._partial) > WATCH_EVENT_MAX_BYTES:
            self.end(f"a watch event longer than {WATCH_EVENT_MAX_BYTES} bytes")
        return parsed

    def _event(self, line: bytes) -> int:
        try:
            event = msgspec.json.decode(line)
        except msgspec.DecodeError:
            self.end("the watch sent a line that is not JSON")
            return 0
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if kind == "ERROR":
            message = obj.get("message") if isinstance(obj, dict) else None
            self.end(f"the watch ended with an error: {message or obj!r}")
            return 0
        if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
            self.events += 1
            self.newest_type, self.newest = str(kind), obj
            return 1
        return 0  # BOOKMARK (not asked for) or an unknown type: no state in it

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason

    def view(self, fresh: bool) -> WatchView:
        return WatchView(fresh, self.newest_type, self.newest, self.ended)


Step = BeforeRequest | Send | SendAll | Pause | OpenWatch | NextChange
Operation = Generator[Step, Any, T]


class Stepper(Generic[T]):
    """Runs one operation for a driver: ``next()`` gives the step to do (None once the
    operation has returned: then ``result`` holds its value), ``reply``/``fail`` say how
    the last ``Send`` went. An exception the operation raises comes out of ``next()``.

    Used as a context manager, it closes the operation however the driver leaves it."""

    def __init__(self, operation: Operation[T]) -> None:
        self._operation = operation
        self._reply: Any = None
        self._failure: DriverError | None = None
        self.result: T | None = None

    def next(self) -> Step | None:
        reply, failure = self._reply, self._failure
        self._reply, self._failure = None, None
        try:
            if failure is not None:
                return self._operation.throw(failure)
            return self._operation.send(reply)
        except StopIteration as done:
            self.result = done.value
            return None

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, failure: DriverError) -> None:
        self._failure = failure

    def __enter__(self) -> Stepper[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._operation.close()


# ---- what a driver throws into an operation -------------------------------------------------


class DriverError(Exception):
    """How one ``Send`` failed; a driver raises exactly one of the subclasses."""


class ApiStatusError(DriverError):
    """The API server answered with a non-2xx status. ``body`` is its text (a Status)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class NotConnected(DriverError):
    """No connection was made (refused, name unknown, connect timed out): not a byte of the
    request reached the API server. The message says which, in words."""


class NoAnswer(DriverError):
    """The request was sent (or may have been) and no complete answer came in time."""


class ConnectionLost(DriverError):
    """The connection broke after the request was sent (reset, closed mid-answer)."""


def api_message(exc: ApiStatusError) -> str:
    """The API server's Status message, else the raw reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or f"HTTP {exc.status}")


def error_for(exc: ApiStatusError, what: str) -> AdapterError:
    """Map an API error (other than a 409 the caller handles) to the adapter's classes."""
    message = api_message(exc)
    if exc.status == 404:
        return NotFound(f"{what}: not found ({message})")
    if exc.status == 403:
        return Rejected(f"{what}: refused by the API server: {message}")
    if exc.status in (400, 422):
        return Invalid(f"{what}: the API server found the object invalid: {message}")
    return AdapterError(f"{what}: API error {exc.status}: {message}")


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


def _custom_path(resource: Resource, namespace: str | None, name: str = "") -> str:
    """The path of a custom resource collection (cluster-scoped when ``namespace`` is None)
    or, with ``name``, of one object."""
    base = f"/apis/{resource.group}/{resource.version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{resource.plural}"
    return f"{base}/{quote(name, safe='')}" if name else base


def _get_request(resource: Resource, namespace: str, name: str) -> tuple[Request, Http]:
    """The GET of one namespaced object, as the request log names it and as it is sent."""
    return (
        Request("get", resource.plural, namespace, name),
        Http("GET", _custom_path(resource, namespace, name)),
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
        try:
            body = decisions.validate_start_body(
                trainjob, mode=self.mode, annotations=self.annotations
            )
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
        ref = Ref(body["metadata"]["namespace"], body["metadata"]["name"])
        req = Request("create", TRAINJOB.plural, ref.namespace, ref.name)
        http = Http(
            "POST",
            _custom_path(TRAINJOB, ref.namespace),
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
        uid = str(created["metadata"]["uid"])
        timed_out = (
            f"start {ref}: the TrainJob was created but its Workload did not appear before the"
            " deadline (is Kueue running and the queue-name label right?)"
        )
        while True:
            try:
                workload = yield from self._discover_workload(ref, uid, deadline)
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
            return decisions.decide_open(
                trainjob, mode=self.mode, now=self._clock(), annotations=self.annotations
            )
            yield  # a generator: nothing to ask

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
            return decisions.decide_hold(
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
            yield  # a generator: nothing to ask

        read = yield from self._held_reader(ref, deadline, what)
        yield from self._read_decide_write(
            self._held_resource, read, decide, deadline, what, on_conflict=conflicted.append
        )

    def _release(self, ref: Ref, meta: CallMeta) -> Operation[None]:
        """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force."""
        deadline = self._deadline(meta)
        instance = self._instance(meta)
        what = f"release {ref} instance {instance}"
        # The read the call's last pod check followed, when it found no pod. A retry whose
        # read proves the TrainJob stayed suspended since then writes without listing again
        # (decisions.pod_check_carries_over): under a busy status writer the LIST's round
        # trip between read and write is what made plain-mode Release lose most retries.
        no_pods_after: Obj | None = None

        def decide(held: Obj) -> Operation[Decision]:
            nonlocal no_pods_after
            pods_remain: bool | None = None
            in_force = objects.hold_instance(held, self.annotations) == instance
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

        read = yield from self._held_reader(ref, deadline, what)
        yield from self._read_decide_write(self._held_resource, read, decide, deadline, what)

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
        )

    def _preflight(self, namespace: str, refresh: bool) -> Operation[PreflightResult]:
        """Probe what the adapter can do in ``namespace`` (every probe, dry-run creates
        included) and cache it for Hold/Release. ``refresh=False`` returns the cached result
        when there is one (which may come from the lighter lazy check)."""
        if not refresh:
            cached = self._preflights.get(namespace)
            if cached is not None:
                return cached
        result = yield from self._run_preflight(namespace, None)
        self._preflights[namespace] = result
        return result

    # ---- hold-family helpers ---------------------------------------------------------

    @property
    def _held_resource(self) -> Resource:
        return WORKLOAD if self.mode == "kueue" else TRAINJOB

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

    def _first_read(self, ref: Ref, deadline: datetime, what: str) -> Operation[Obj | None]:
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
            held = yield from self._read_held(ref, deadline, what)
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
                result = yield from self._run_access_preflight(namespace, deadline)
            else:
                result = yield from self._run_preflight(namespace, deadline)
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
        was, now = conflicted.get("metadata") or {}, obj.get("metadata") or {}
        if (
            now.get("uid") != was.get("uid")
            or now.get("ownerReferences") != was.get("ownerReferences")
            or now.get("deletionTimestamp") is not None
        ):
            follow.unusable = True
            return None
        if now.get("resourceVersion") == was.get("resourceVersion"):
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
            _custom_path(resource, namespace),
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
        self, ref: Ref, deadline: datetime, what: str
    ) -> Operation[Callable[[], Operation[Obj]]]:
        """Reads of the held object for one call: the first is ``_first_read`` (which also
        checks preflight), every later one (after a conflict) ``_read_held``."""
        first = yield from self._first_read(ref, deadline, what)

        def read() -> Operation[Obj]:
            nonlocal first
            obj, first = first, None
            if obj is not None:
                return obj
            return (yield from self._read_held(ref, deadline, what))

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

    def _read_held(self, ref: Ref, deadline: datetime, what: str) -> Operation[Obj]:
        """Read the held object: the Workload (Kueue mode) or the TrainJob (plain mode)."""
        if self.mode == "plain":
            return (yield from self._get(TRAINJOB, ref.namespace, ref.name, deadline, what))
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
        if workload is None:
            self._workloads.pop(ref, None)
            uid = str(trainjob["metadata"]["uid"])
            workload = yield from self._discover_workload(ref, uid, deadline)
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
        if cached[0] != str(trainjob["metadata"]["uid"]) or not _live_workload_of(
            workload, cached[0]
        ):
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
        uid = str(trainjob["metadata"]["uid"]) if trainjob is not None else None
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
            uid = str(trainjob["metadata"]["uid"])
        assert uid is not None
        return (yield from self._discover_workload(ref, uid, deadline))

    def _discover_workload(
        self, ref: Ref, uid: str, deadline: datetime | None
    ) -> Operation[Obj | None]:
        """List Workloads labelled job-uid=<uid> and keep the one the TrainJob controls."""
        req = Request("list", WORKLOAD.plural, ref.namespace)
        http = Http(
            "GET",
            _custom_path(WORKLOAD, ref.namespace),
            query=(("labelSelector", f"{JOB_UID_LABEL}={uid}"),),
        )
        try:
            listed = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            raise error_for(exc, f"find the Workload of {ref}") from exc
        owned = [w for w in listed.get("items") or [] if _live_workload_of(w, uid)]
        if not owned:
            return None
        if len(owned) > 1:
            names = sorted(str(w["metadata"]["name"]) for w in owned)
            raise Rejected(f"{ref} has several Workloads {names}; refusing to guess")
        workload: Obj = owned[0]
        # The list response's items carry no apiVersion/kind; a write's body needs them.
        workload.setdefault("apiVersion", WORKLOAD.api_version)
        workload.setdefault("kind", WORKLOAD.kind)
        self._workloads[ref] = (uid, str(workload["metadata"]["name"]))
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
            metadata = pod.get("metadata") or {}
            pods.append(
                {
                    "name": metadata.get("name"),
                    "deleting": metadata.get("deletionTimestamp") is not None,
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
            _custom_path(resource, meta["namespace"], meta["name"]),
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

    # ---- preflight -------------------------------------------------------------------

    def _run_preflight(
        self, namespace: str, deadline: datetime | None
    ) -> Operation[PreflightResult]:
        runtime_ref = yield from self._probe_runtime_ref(namespace, deadline)
        extra: dict[str, Capability] = {}
        if self.mode == "kueue":
            gate, multikueue = yield from self._probe_readmission_gate(namespace, deadline)
            extra["readmissionGate"] = gate
            extra["multiKueue"] = multikueue
        extra["holdOwnership"] = yield from self._probe_ownership(deadline)
        round_trip = yield from self._probe_round_trip(namespace, deadline, runtime_ref)
        update_workloads = yield from self._probe_access(
            namespace, WRITE_VERB, WORKLOAD.group, WORKLOAD.plural, deadline
        )
        update_trainjobs = yield from self._probe_access(
            namespace, WRITE_VERB, TRAINJOB.group, TRAINJOB.plural, deadline
        )
        list_pods = yield from self._probe_access(namespace, "list", "", "pods", deadline)
        enforcer = yield from self._probe_enforcer(namespace, deadline, runtime_ref)
        return PreflightResult(
            mode=self.mode,
            namespace=namespace,
            hold_round_trip=round_trip,
            update_workloads=update_workloads,
            update_trainjobs=update_trainjobs,
            list_pods=list_pods,
            enforcer_installed=enforcer,
            extra=extra,
        )

    def _run_access_preflight(
        self, namespace: str, deadline: datetime
    ) -> Operation[PreflightResult]:
        """The light check: SelfSubjectAccessReviews only, no dry-run create (so no create
        right is needed). The round trip is not probed; it stands for the right to update
        the held resource, which is what the Hold's own write needs: one review."""
        not_probed = "not probed (access reviews only; run `holdwarden preflight`)"
        resource = self._held_resource
        held = yield from self._probe_access(
            namespace, WRITE_VERB, resource.group, resource.plural, deadline
        )
        other = Capability(False, not_probed)
        workloads, trainjobs = (held, other) if resource is WORKLOAD else (other, held)
        return PreflightResult(
            mode=self.mode,
            namespace=namespace,
            hold_round_trip=Capability(held.supported, f"{not_probed}; {held.reason}"),
            update_workloads=workloads,
            update_trainjobs=trainjobs,
            list_pods=Capability(False, not_probed),
            enforcer_installed=Capability(False, not_probed),
        )

    def _list(
        self, resource: Resource, namespace: str | None, deadline: datetime | None, limit: int
    ) -> Operation[list[Obj]]:
        """LIST a custom resource (cluster-scoped when ``namespace`` is None)."""
        req = Request("list", resource.plural, namespace or "")
        http = Http("GET", _custom_path(resource, namespace), query=(("limit", str(limit)),))
        answer = yield from self._send(req, deadline, http)
        items: list[Obj] = answer.get("items") or []
        return items

    def _get_cluster(
        self, resource: Resource, name: str, deadline: datetime | None
    ) -> Operation[Obj]:
        req = Request("get", resource.plural, "", name)
        http = Http("GET", _custom_path(resource, None, name))
        obj: Obj = yield from self._send(req, deadline, http)
        return obj

    def _probe_runtime_ref(self, namespace: str, deadline: datetime | None) -> Operation[Obj]:
        """A ``spec.runtimeRef`` that Trainer's and Kueue's TrainJob webhooks accept.

        Both resolve the runtime a TrainJob names and refuse a create naming one that does
        not exist ("runtime not found"). Validating webhooks run in parallel and Kubernetes
        does not say whose refusal is reported, so a probe naming a made-up runtime may be
        refused by Trainer before the hold rules are even looked at. The probe therefore
        names a runtime that exists: a TrainingRuntime of the namespace, else a
        ClusterTrainingRuntime. With no Trainer installed (no such resources, or no right
        to list them), a placeholder is named: then nothing resolves it either.
        """
        scopes: tuple[tuple[Resource, str | None], ...] = (
            (TRAININGRUNTIME, namespace),
            (CLUSTERTRAININGRUNTIME, None),
        )
        for resource, scope in scopes:
            try:
                items = yield from self._list(resource, scope, deadline, limit=1)
            except ApiStatusError:
                continue
            if items:
                name = (items[0].get("metadata") or {}).get("name")
                if name:
                    return {"name": name, "apiGroup": resource.group, "kind": resource.kind}
        return {"name": PROBE_RUNTIME_PLACEHOLDER}

    def _probe_readmission_gate(
        self, namespace: str, deadline: datetime | None
    ) -> Operation[tuple[Capability, Capability]]:
        """Kueue mode: do the namespace's queues re-admit only through the readmission gate,
        and is every queue that dispatches through MultiKueue gated? (readmissionGate,
        multiKueue)

        Without the gate, a Release lets Kueue re-admit while pods of the held execution
        still terminate (two executions at once), and a job runs without any Open. With
        MultiKueue and no gate, a Release lets MultiKueue dispatch the job again, maybe to
        another worker, while the held execution may still run on the first: Kueue does
        not wait for its pods, and only the gate counts them on the workers. Hold still
        works, so both are reported, not made a condition of Hold (the spec fixes those).
        """
        controller = self.config.readmission.controller_name
        try:
            queues = yield from self._list(LOCALQUEUE, namespace, deadline, limit=100)
        except ApiStatusError as exc:
            why = f"could not list LocalQueues in {namespace}: {api_message(exc)}"
            return Capability(False, why), Capability(False, why)
        if not queues:
            return (
                Capability(
                    False,
                    f"no LocalQueue in {namespace}: no job here can be admitted by Kueue, and "
                    f"none is gated by {controller}",
                ),
                Capability(True, f"no LocalQueue in {namespace} dispatches through MultiKueue"),
            )
        check_controllers: dict[str, object] = {}
        ungated: list[str] = []
        dispatching: list[tuple[str, bool]] = []
        for queue in queues:
            lq = (queue.get("metadata") or {}).get("name", "?")
            cq = (queue.get("spec") or {}).get("clusterQueue", "")
            try:
                cluster_queue = yield from self._get_cluster(CLUSTERQUEUE, cq, deadline)
                names = decisions.cluster_queue_admission_checks(cluster_queue)
                for check in names:
                    if check not in check_controllers:
                        got = yield from self._get_cluster(ADMISSIONCHECK, check, deadline)
                        check_controllers[check] = (got.get("spec") or {}).get("controllerName")
            except ApiStatusError as exc:
                why = (
                    f"could not read ClusterQueue {cq!r} of LocalQueue {namespace}/{lq} or its "
                    f"AdmissionChecks: {api_message(exc)}; grant get on clusterqueues and "
                    "admissionchecks, or check the queue by hand"
                )
                return Capability(False, why), Capability(False, why)
            gated = any(check_controllers.get(check) == controller for check in names)
            where = f"LocalQueue {namespace}/{lq} (ClusterQueue {cq})"
            if not gated:
                ungated.append(where)
            if any(check_controllers.get(c) == MULTIKUEUE_CONTROLLER for c in names):
                dispatching.append((where, gated))
        gate = Capability(
            True, f"every LocalQueue in {namespace} re-admits only through {controller}"
        )
        if ungated:
            gate = Capability(
                False,
                f"{', '.join(ungated)} lists no AdmissionCheck with controllerName {controller}: "
                "a Release there lets Kueue re-admit while pods of the held execution remain, "
                "and jobs run without Open; add the readmission AdmissionCheck to the "
                "ClusterQueue's spec.admissionChecksStrategy (manifests/readmission)",
            )
        return gate, decisions.multikueue_capability(namespace, controller, dispatching)

    def _probe_access(
        self, namespace: str, verb: str, group: str, resource: str, deadline: datetime | None
    ) -> Operation[Capability]:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                }
            },
        }
        what = f"{verb} {resource}{'.' + group if group else ''} in {namespace}"
        req = Request("access-review", "selfsubjectaccessreviews", namespace, what)
        http = Http("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review)
        try:
            answer = yield from self._send(req, deadline, http)
        except ApiStatusError as exc:
            return Capability(False, f"could not ask whether we may {what}: {api_message(exc)}")
        status = answer.get("status") or {}
        if status.get("allowed"):
            return Capability(True, f"may {what}")
        why = str(status.get("reason") or status.get("evaluationError") or "")
        return Capability(False, f"may not {what}" + (f": {why}" if why else " (RBAC)"))

    def _probe_ownership(self, deadline: datetime | None) -> Operation[Capability]:
        """Is hold-owner-only in force for this configuration, and is this adapter a holder?

        Read from ``webhook.holderIdentities`` (the enforcer reads the same file) and the
        identity the apiserver authenticates us as (SelfSubjectReview). No write can show
        it: a holder's writes pass the rule, which is the point of it (docs/policy.md).
        """
        holders = self.config.webhook.holder_identities
        if not holders:
            return Capability(
                False,
                "hold-owner-only is off (webhook.holderIdentities is empty): anyone who may "
                "update the held object can lift a hold",
            )
        req = Request("self-subject-review", "selfsubjectreviews", "")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        http = Http("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body)
        try:
            review = yield from self._send(req, deadline, http)
            info = review["status"]["userInfo"]
            user, groups = str(info.get("username") or ""), list(info.get("groups") or [])
        except (ApiStatusError, KeyError, TypeError, AttributeError) as exc:
            return Capability(False, f"hold-owner-only is configured, but who we are is "
                              f"unknown (SelfSubjectReview failed: {exc})")  # fmt: skip
        if user in holders or any(g in holders or g == BREAK_GLASS_GROUP for g in groups):
            return Capability(True, f"hold-owner-only is configured for {list(holders)}, and "
                              f"this adapter ({user}) is a holder")  # fmt: skip
        return Capability(
            False,
            f"hold-owner-only is configured for {list(holders)}, but this adapter runs as "
            f"{user}: the enforcer will refuse its Hold and Release",
        )

    def _preflight_name(self) -> str:
        return f"holdwarden-preflight-{secrets.token_hex(4)}"

    def _held_probe_body(self, namespace: str, runtime_ref: Obj) -> tuple[Resource, Obj]:
        ann = self.annotations
        annotations = {
            ann.hold_instance: "1",
            ann.hold_reason: "preflight hold round trip",
            ann.held_at: objects.format_time(self._clock()),
            ann.held_by: self.config.holder,
        }
        meta = {"name": self._preflight_name(), "namespace": namespace, "annotations": annotations}
        if self.mode == "kueue":
            return WORKLOAD, {
                "apiVersion": WORKLOAD.api_version,
                "kind": WORKLOAD.kind,
                "metadata": meta,
                "spec": {
                    "active": False,
                    "podSets": [
                        {
                            "name": "main",
                            "count": 1,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "probe", "image": "busybox"}],
                                }
                            },
                        }
                    ],
                },
            }
        return TRAINJOB, {
            "apiVersion": TRAINJOB.api_version,
            "kind": TRAINJOB.kind,
            "metadata": meta,
            "spec": {"runtimeRef": dict(runtime_ref), "suspend": True},
        }

    @staticmethod
    def _dry_run_create(resource: Resource, namespace: str, body: Obj) -> Http:
        return Http(
            "POST",
            _custom_path(resource, namespace),
            query=(("dryRun", "All"), ("fieldManager", FIELD_MANAGER)),
            body=body,
        )

    def _probe_round_trip(
        self, namespace: str, deadline: datetime | None, runtime_ref: Obj
    ) -> Operation[Capability]:
        """Server-side dry-run create of a correctly held object; the echo must keep it."""
        resource, body = self._held_probe_body(namespace, runtime_ref)
        req = Request("dry-run-create", resource.plural, namespace, body["metadata"]["name"])
        try:
            echo = yield from self._send(
                req, deadline, self._dry_run_create(resource, namespace, body)
            )
        except ApiStatusError as exc:
            return Capability(
                False,
                f"dry-run create of a held {resource.kind} failed: {api_message(exc)}"
                + _not_ours_hint(exc),
            )
        want = objects.annotations_of(body)
        got = objects.annotations_of(echo)
        lost = sorted(k for k, v in want.items() if got.get(k) != v)
        if lost:
            return Capability(False, f"the API server dropped or changed annotations {lost}")
        if not objects.hold_field_set(echo, self.mode):
            field = "spec.active=false" if self.mode == "kueue" else "spec.suspend=true"
            return Capability(
                False, f"the API server did not keep {field} on a held {resource.kind}"
            )
        return Capability(True, f"a held {resource.kind} round-trips (server-side dry run)")

    def _probe_enforcer(
        self, namespace: str, deadline: datetime | None, runtime_ref: Obj
    ) -> Operation[Capability]:
        """Dry-run create of the held object carrying a hold instance without its hold
        field: the enforcer must refuse it, by held-workload-inactive in Kueue mode (a
        Workload, active) or held-trainjob-suspended in plain mode (a TrainJob, unsuspended).

        The probe is the mode's own held kind, built to pass every other admission check
        (a valid Workload; a TrainJob naming a runtime that exists), so that a refusal by
        another webhook is unlikely and, when it happens, is reported as such.
        """
        resource, body = self._held_probe_body(namespace, runtime_ref)
        body["metadata"]["annotations"] = {self.annotations.hold_instance: "1"}
        if resource is WORKLOAD:
            body["spec"]["active"] = True
            rule = RuleId.HELD_WORKLOAD_INACTIVE.value
        else:
            body["spec"]["suspend"] = False
            rule = RuleId.HELD_TRAINJOB_SUSPENDED.value
        name = body["metadata"]["name"]
        req = Request("dry-run-create", resource.plural, namespace, name)
        try:
            yield from self._send(req, deadline, self._dry_run_create(resource, namespace, body))
        except ApiStatusError as exc:
            message = api_message(exc)
            if rule in message or rule in (exc.body or ""):
                return Capability(True, f"the enforcer refused a hold-breaking write ({rule})")
            return Capability(
                False,
                "inconclusive: a hold-breaking dry-run write was refused, but not by the "
                f"enforcer: {message}" + _not_ours_hint(exc),
            )
        return Capability(
            False,
            f"a {resource.kind} carrying a hold instance without its hold field was accepted: "
            "no enforcer is installed",
        )


def _not_ours_hint(exc: ApiStatusError) -> str:
    """A hint when a probe was refused by some other admission plugin, not a hold rule.

    Validating webhooks run in parallel; when several refuse, which one's message comes back
    is not defined. Naming that case tells the operator the probe says nothing about holds.
    """
    text = f"{api_message(exc)} {exc.body or ''}"
    if any(rule.value in text for rule in RuleId) or exc.status not in (400, 403, 422):
        return ""
    if "denied" in text:
        return (
            " (refused by another admission check, not by a hold rule: the probe could not "
            "reach the hold check; see that check's message above)"
        )
    return ""
