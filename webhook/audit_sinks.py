"""Where refusals go besides the durable file: standard output and Kubernetes Events.

``webhook.auditSinks`` names the sinks (docs/configuration.md):

- ``file``: the fsynced JSON-lines file of ``webhook/audit.py`` (unchanged, not here);
- ``stdout`` (``StdoutSink``): the same record as one JSON line on standard output, with
  ``"audit": true`` first so a log pipeline can select it (the server's own logs go to
  stderr). One writer thread writes whole lines in order, so a line is never torn or
  interleaved; a refusal waits for its line at most ``STDOUT_WAIT`` seconds, and a stdout
  that stays blocked costs queued lines (counted), never an admission answer;
- ``events`` (``EventsSink``): an ``events.k8s.io/v1`` Event regarding the refused object
  per distinct refusal. Identical refusals (same object, rule, user and operation) within
  ``webhook.auditEvents.window`` of the Event's last write fold into that one Event, whose
  ``series.count`` and ``series.lastObservedTime`` are updated. Writes pass a token bucket
  (``qps``/``burst``); refusals waiting to be written sit in a bounded queue (one entry per
  distinct refusal; when full, new ones are dropped and counted). One background worker
  writes them, every call bounded by ``requestTimeout``; ``offer`` never blocks, so the
  API being slow, unreachable or refusing never delays or changes an admission answer.
  Dry-run refusals are never Events: the caller asked for no side effects.

Pure parts (``dedup_key``, ``TokenBucket``, ``SeriesCache``, ``event_body``,
``record_from_event``) take their clock as an argument, so they are table-tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from holdwarden.config import AUDIT_SINKS, AuditEventsConfig
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, event_reason, rule_of_event_reason
from holdwarden.webhook.audit import bounded_line, rfc3339

log = logging.getLogger("holdwarden.webhook.audit")

SINK_NAMES = AUDIT_SINKS

# --- stdout -----------------------------------------------------------------------------

STDOUT_WAIT = 1.0  # seconds a refusal waits for its stdout line before it is answered
STDOUT_MAX_PENDING = 10_000  # lines queued behind a blocked stdout, then dropped


def stdout_line(record: Mapping[str, Any]) -> bytes:
    """The stdout line of ``record``: the file's line with ``"audit": true`` first (whole,
    at most ``MAX_LINE_BYTES``, one trailing newline)."""
    return bounded_line({"audit": True, **{k: v for k, v in record.items() if k != "audit"}})


class StdoutSink:
    """Writes audit lines to a file descriptor (standard output) from one writer thread.

    Invariant: lines reach the descriptor whole and in order (one thread, and a short
    write is continued before the next line), so a reader never sees a torn or interleaved
    line. ``append`` returns once its line is written, or after ``wait`` seconds while the
    line stays queued; at most ``max_pending`` lines are queued, later ones are dropped.
    """

    name = "stdout"

    def __init__(
        self, fd: int = 1, *, wait: float = STDOUT_WAIT, max_pending: int = STDOUT_MAX_PENDING
    ) -> None:
        self.fd = fd
        self.wait = wait
        self.max_pending = max_pending
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.lines = 0
        self.late = 0  # answered before the line was written (stdout blocked)
        self.dropped = 0
        self.failed = 0

    def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-stdout")

    async def append(self, record: Mapping[str, Any]) -> None:
        """Queue the record's line and wait (bounded) until it is written. Never raises."""
        if self._executor is None or len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((stdout_line(record), done))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        try:
            # shield: a timeout must not cancel the future the flusher resolves.
            await asyncio.wait_for(asyncio.shield(done), self.wait)
        except TimeoutError:
            self.late += 1
        except OSError:
            pass  # counted in ``failed`` by the flusher, logged once per batch

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending and self._executor is not None:
                batch, self._pending = self._pending, []
                error = await loop.run_in_executor(
                    self._executor, self._write, b"".join(line for line, _ in batch)
                )
                for _, done in batch:
                    if not done.done():
                        done.set_result(None) if error is None else done.set_exception(error)
                if error is None:
                    self.lines += len(batch)
                else:
                    self.failed += len(batch)
                    log.error(
                        "audit lines could not be written to stdout",
                        extra={"fields": {"lines": len(batch), "error": str(error)}},
                    )
        finally:
            self._flusher = None

    def _write(self, data: bytes) -> OSError | None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            return exc
        return None

    async def aclose(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), then stop the thread."""
        flusher = self._flusher
        if flusher is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(flusher), timeout)
        if self._executor is not None:
            # A thread stuck on a blocked stdout is not waited for: the process is ending.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


# --- Events: the pure parts -------------------------------------------------------------

REPORTING_CONTROLLER = "holdwarden.io/enforcer"
NOTE_LIMIT = 1024  # bytes; the API refuses a longer note
EVENT_REASON_LIMIT = 128
EVENT_NAME_LIMIT = 253

DedupKey = tuple[str, str, str, str, str, str, str]


def dedup_key(record: Mapping[str, Any]) -> DedupKey:
    """Identical refusals share a key: same object (namespace, API group, resource, name),
    rule, user and operation. Time, uid, message and instance are not part of it."""
    return tuple(  # type: ignore[return-value]  # seven strings
        str(record.get(name) or "")
        for name in ("namespace", "apiGroup", "resource", "name", "rule", "user", "operation")
    )


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved; starts full.

    Invariant: over any interval of length t, at most ``burst + rate * t`` tokens are taken.
    """

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float) -> bool:
        """Take one token if there is one."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def delay(self, now: float) -> float:
        """Seconds from ``now`` until a token is there (0 if one is)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate


@dataclass
class Series:
    """The Event of a key: its name and namespace, how many refusals it stands for
    (``count``, including those still being written), how many the API server is known to
    hold (``confirmed``), whether its create is known to have landed, and when it was last
    written (monotonic seconds).

    ``count`` is advanced before a write and every write carries it whole (the create's
    count, a patch's absolute ``series.count``), so a write that is retried, or that
    landed after its client gave up, can only ever say the same or a larger total.
    """

    name: str
    namespace: str
    count: int
    written: float
    confirmed: int = 0
    created: bool = True
    first: datetime | None = None
    last: datetime | None = None


class SeriesCache:
    """The Events written within ``window`` seconds, by key, at most ``capacity`` of them
    (the least recently written is forgotten first).

    Invariant: ``get`` returns a series only if it was written less than ``window`` seconds
    before ``now``; an older one is forgotten, so the next refusal makes a new Event.
    """

    def __init__(self, window: float, capacity: int = 4096) -> None:
        self.window = window
        self.capacity = capacity
        self._series: OrderedDict[DedupKey, Series] = OrderedDict()

    def get(self, key: DedupKey, now: float) -> Series | None:
        series = self._series.get(key)
        if series is not None and now - series.written >= self.window:
            del self._series[key]
            return None
        return series

    def put(self, key: DedupKey, series: Series) -> None:
        self._series[key] = series
        self._series.move_to_end(key)
        while len(self._series) > self.capacity:
            self._series.popitem(last=False)

    def forget(self, key: DedupKey) -> None:
        self._series.pop(key, None)

    def __len__(self) -> int:
        return len(self._series)


def truncate_note(message: str, limit: int = NOTE_LIMIT) -> str:
    """``message`` in at most ``limit`` UTF-8 bytes, cut on a character boundary and ended
    with ``...`` when cut."""
    data = message.encode()
    if len(data) <= limit:
        return message
    return data[: limit - 3].decode(errors="ignore") + "..."


def _api_version(group: str, resource: str) -> str:
    for coords in (TRAINJOB, WORKLOAD):
        if group == coords.group and resource == coords.plural:
            return f"{coords.group}/{coords.version}"
    return f"{group}/v1" if group else "v1"


def event_name(object_name: str, key: DedupKey, moment: datetime) -> str:
    """``<object>.<16 hex>``, as kubectl and client-go name Events; unique per key and
    time, a DNS subdomain of at most 253 characters."""
    digest = hashlib.sha256(repr((key, rfc3339(moment))).encode()).hexdigest()[:16]
    base = (object_name or "refusal").lower()[: EVENT_NAME_LIMIT - 17].rstrip(".-")
    return f"{base or 'refusal'}.{digest}"


@dataclass(frozen=True)
class EventLabels:
    """The label and annotation keys the sink writes and ``--from-cluster`` reads."""

    prefix: str

    @property
    def audit(self) -> str:  # label, value "refusal": selects our Events
        return f"{self.prefix}/audit"

    @property
    def user(self) -> str:
        return f"{self.prefix}/audit-user"

    @property
    def operation(self) -> str:
        return f"{self.prefix}/audit-operation"

    @property
    def instance(self) -> str:
        return f"{self.prefix}/audit-instance"

    @property
    def uid(self) -> str:  # the first refused request's uid
        return f"{self.prefix}/audit-uid"


def event_body(
    record: Mapping[str, Any],
    *,
    name: str,
    count: int,
    first: datetime,
    last: datetime,
    instance: str,
    labels: EventLabels,
) -> dict[str, Any]:
    """The ``events.k8s.io/v1`` Event for ``count`` identical refusals like ``record``,
    first seen at ``first`` and last at ``last``: ``regarding`` the refused object, reason
    the rule id, the note the refusal message (truncated to the API's limit), and
    ``series`` when ``count`` is 2 or more (the API requires ``series.count >= 2``)."""
    namespace = str(record.get("namespace") or "")
    group = str(record.get("apiGroup") or "")
    resource = str(record.get("resource") or "")
    operation = str(record.get("operation") or "")
    annotations = {
        labels.user: str(record.get("user") or ""),
        labels.operation: operation,
        labels.uid: str(record.get("uid") or ""),
    }
    if record.get("instance") is not None:
        annotations[labels.instance] = str(record["instance"])
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": name,
            # An Event regarding a namespaced object lives in its namespace; one with no
            # namespace (a forged review) must go to "default".
            "namespace": namespace or "default",
            "labels": {labels.audit: "refusal"},
            "annotations": annotations,
        },
        "eventTime": rfc3339(first),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance[:128],
        "action": ("Refuse" + operation.title())[:128] or "Refuse",
        "reason": event_reason(str(record.get("rule") or ""))[:EVENT_REASON_LIMIT],
        "type": "Warning",
        "note": truncate_note(str(record.get("message") or "")),
        "regarding": {
            "apiVersion": _api_version(group, resource),
            "kind": str(record.get("kind") or resource),
            "namespace": namespace,
            "name": str(record.get("name") or ""),
        },
    }
    if count >= 2:
        body["series"] = {"count": count, "lastObservedTime": rfc3339(last)}
    return body


def series_patch(count: int, last: datetime) -> dict[str, Any]:
    """The merge patch that brings an Event's series to ``count`` refusals, the last at
    ``last``."""
    return {"series": {"count": count, "lastObservedTime": rfc3339(last)}}


def record_from_event(event: Mapping[str, Any], labels: EventLabels) -> dict[str, Any]:
    """The audit record (the fields ``holdwarden audit`` shows) an Event of ours stands
    for, plus ``count``, ``firstTime`` and ``reportingInstance``; ``time`` is the last
    refusal's."""
    meta = event.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    regarding = event.get("regarding") or {}
    series = event.get("series") or {}
    api_version = str(regarding.get("apiVersion") or "")
    first = event.get("eventTime") or meta.get("creationTimestamp")
    return {
        "time": series.get("lastObservedTime") or first,
        "firstTime": first,
        "count": int(series.get("count") or 1),
        "rule": rule_of_event_reason(event.get("reason")),
        "message": event.get("note"),
        "user": annotations.get(labels.user),
        "operation": annotations.get(labels.operation),
        "instance": annotations.get(labels.instance),
        "uid": annotations.get(labels.uid),
        "apiGroup": api_version.rpartition("/")[0] if "/" in api_version else "",
        "kind": regarding.get("kind"),
        "namespace": regarding.get("namespace") or None,
        "name": regarding.get("name"),
        "dryRun": False,
        "reportingInstance": event.get("reportingInstance"),
        "event": f"{meta.get('namespace')}/{meta.get('name')}",
    }


# --- Events: the sink -------------------------------------------------------------------


@dataclass
class _Pending:
    """Refusals of one key waiting to be written: how many, the latest record, when."""

    record: Mapping[str, Any]
    count: int
    first: datetime
    last: datetime
    attempts: int = 0  # failed writes of this key so far (a retry carries count 0)


# A write that failed for a reason that may pass (no answer, 429, 5xx) is tried again, at
# most this many times in all, inside the token bucket; then its refusals count as failed.
# Small, because one worker writes: a hanging API costs each key attempts x requestTimeout.
EVENT_WRITE_ATTEMPTS = 3


def _transient(exc: EventsApiError) -> bool:
    return exc.status == 0 or exc.status == 429 or exc.status >= 500


@dataclass
class EventCounts:
    """What the Events sink did, by outcome (exported as metrics)."""

    created: int = 0  # Events created
    updated: int = 0  # series patches written
    deduplicated: int = 0  # refusals folded into an Event or a queued entry
    dropped: int = 0  # refusals lost: the queue was full, or shutdown came first
    failed: int = 0  # refusals lost: the API call failed (for good, or too often)
    retried: int = 0  # writes tried again after a failure that may pass
    dry_run: int = 0  # dry-run refusals, never Events
    by_error: dict[str, int] = field(default_factory=dict)


class EventsClient(Protocol):
    """Writes Events, each call bounded by its own timeout; raises ``EventsApiError`` on
    any failure. ``KubeEvents`` is the real one."""

    def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class EventsApiError(Exception):
    """An Events API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class KubeEvents:
    """``events.k8s.io/v1`` through a kubernetes ``ApiClient``; every call has a timeout."""

    def __init__(self, api: Any, timeout: float) -> None:
        import copy

        from kubernetes import client as k8s

        # A client of its own with urllib3's retries off: a retried connect would make one
        # call last several timeouts. The same credentials and headers (impersonation).
        configuration = copy.deepcopy(api.configuration)
        configuration.retries = 0
        self.client = k8s.ApiClient(configuration)
        for name, value in api.default_headers.items():
            self.client.default_headers[name] = value
        self.api = k8s.EventsV1Api(self.client)
        self.timeout = timeout

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = fn(*args, _request_timeout=self.timeout, _preload_content=False)
            response.release_conn()
        except ApiException as exc:
            raise EventsApiError(int(exc.status or 0), f"{exc.status} {exc.reason}") from exc
        except Exception as exc:  # urllib3's connection and timeout errors, and others
            raise EventsApiError(0, f"{type(exc).__name__}: {exc}") from exc

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self._call(self.api.create_namespaced_event, namespace, body)

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._call(self.api.patch_namespaced_event, name, namespace, body)


def reporting_instance() -> str:
    """This replica's name for ``reportingInstance``: ``$POD_NAME``, else the host name
    (a Pod's host name is its name)."""
    return os.environ.get("POD_NAME") or socket.gethostname() or "holdwarden"


class EventsSink:
    """Refusals as deduplicated, rate-limited Events, written by one background worker.

    Invariants: ``append`` never blocks and never raises; at most ``queueSize`` distinct
    refusals wait; at most ``burst + qps * t`` API writes happen in any ``t`` seconds;
    every API call runs on the sink's own thread, bounded by ``requestTimeout``;
    ``aclose`` writes what is queued for at most its timeout, then counts the rest as
    dropped.
    """

    name = "events"

    def __init__(
        self,
        settings: AuditEventsConfig,
        client: EventsClient,
        *,
        annotation_prefix: str,
        instance: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.client = client
        self.labels = EventLabels(annotation_prefix)
        self.instance = instance or reporting_instance()
        self.monotonic = monotonic
        self.wall = wall
        self.bucket = TokenBucket(settings.qps, settings.burst, monotonic())
        self.cache = SeriesCache(settings.window.total_seconds())
        self.pending: OrderedDict[DedupKey, _Pending] = OrderedDict()
        self.counts = EventCounts()
        self._wake = asyncio.Event()
        self._closing = False
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight = False

    def open(self) -> None:
        """Start the worker (on the running event loop)."""
        if self._worker is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-events")
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def append(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` for an Event; returns at once (see ``offer``)."""
        self.offer(record)

    def offer(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` for an Event, folding it into a queued identical refusal; a
        dry run is counted and skipped; a full queue drops it (counted). Never blocks."""
        if record.get("dryRun"):
            self.counts.dry_run += 1
            return
        if self._closing:
            self.counts.dropped += 1
            return
        key = dedup_key(record)
        now = self.wall()
        queued = self.pending.get(key)
        if queued is not None:
            queued.count += 1
            queued.last = now
            queued.record = record
            self.counts.deduplicated += 1
            return
        if len(self.pending) >= self.settings.queue_size:
            self.counts.dropped += 1
            return
        if self.cache.get(key, self.monotonic()) is not None:
            self.counts.deduplicated += 1  # it will update that Event's series
        self.pending[key] = _Pending(record, 1, now, now)
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self.pending)

    @property
    def idle(self) -> bool:
        """Nothing queued and no write on the wire (a failed write is queued again before
        this turns true)."""
        return not self.pending and not self._in_flight

    async def _run(self) -> None:
        while True:
            if not self.pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = self.bucket.delay(self.monotonic())
            if delay > 0:
                # Refusals that come meanwhile fold into the queued entries.
                await asyncio.sleep(delay)
                continue
            self.bucket.take(self.monotonic())
            key, item = self.pending.popitem(last=False)
            self._in_flight = True
            try:
                await self._write(key, item)
            finally:
                self._in_flight = False

    async def _write(self, key: DedupKey, item: _Pending) -> None:
        """Write ``item``'s refusals into its key's Event: create it, or patch its series
        to the absolute total. Invariant: no refusal is lost or counted twice by a write
        in flight, a retry, or a write that landed after its timeout; a failure that may
        pass is retried (the key is queued again with count 0: the total lives in the
        series), at most ``EVENT_WRITE_ATTEMPTS`` times."""
        now = self.monotonic()
        series = self.cache.get(key, now)
        if series is None:
            series = self._new_series(key, item, item.count, now)
        else:
            series.count += item.count
            series.last = max(series.last or item.last, item.last)
            series.written = now
        try:
            await self._send_series(key, series, item)
        except EventsApiError as exc:
            self._failed(key, series, item, exc)

    def _new_series(self, key: DedupKey, item: _Pending, count: int, now: float) -> Series:
        """A series for an Event not yet created, put in the cache at once (optimistic):
        refusals that come while its create is on the wire fold into it."""
        name = event_name(str(item.record.get("name") or ""), key, item.first)
        namespace = str(item.record.get("namespace") or "default")
        series = Series(name, namespace, count, now, 0, False, item.first, item.last)
        self.cache.put(key, series)
        return series

    async def _send_series(self, key: DedupKey, series: Series, item: _Pending) -> None:
        loop = asyncio.get_running_loop()
        assert self._executor is not None
        if series.created:
            try:
                patch = series_patch(series.count, series.last or item.last)
                await loop.run_in_executor(
                    self._executor, self.client.patch, series.namespace, series.name, patch
                )
                series.confirmed = series.count
                self.counts.updated += 1
                return
            except EventsApiError as exc:
                if exc.status != 404:
                    raise
            # The Event is gone (its TTL passed, or someone deleted it): start anew with
            # the refusals it did not hold.
            self.cache.forget(key)
            unwritten = max(1, series.count - series.confirmed)
            series = self._new_series(key, item, unwritten, self.monotonic())
        body = event_body(
            item.record,
            name=series.name,
            count=series.count,
            first=series.first or item.first,
            last=series.last or item.last,
            instance=self.instance,
            labels=self.labels,
        )
        namespace = body["metadata"]["namespace"]
        series.namespace = namespace
        try:
            await loop.run_in_executor(self._executor, self.client.create, namespace, body)
        except EventsApiError as exc:
            if exc.status != 409:
                raise
            # An earlier create of this very name landed, its answer lost: the Event
            # exists with some count up to ours; bring its series to the whole total.
            series.created = True
            self.counts.created += 1
            if series.count >= 2:
                patch = series_patch(series.count, series.last or item.last)
                await loop.run_in_executor(
                    self._executor, self.client.patch, namespace, series.name, patch
                )
                self.counts.updated += 1
            series.confirmed = series.count
            return
        series.created = True
        series.confirmed = series.count
        self.counts.created += 1

    def _failed(self, key: DedupKey, series: Series, item: _Pending, exc: EventsApiError) -> None:
        reason = str(exc.status) if exc.status else "unreachable"
        self.counts.by_error[reason] = self.counts.by_error.get(reason, 0) + 1
        attempts = item.attempts + 1
        if _transient(exc) and attempts < EVENT_WRITE_ATTEMPTS and not self._closing:
            self.counts.retried += 1
            queued = self.pending.get(key)
            if queued is not None:
                queued.attempts = max(queued.attempts, attempts)
            else:
                self.pending[key] = _Pending(item.record, 0, item.first, item.last, attempts)
            self._wake.set()
            return
        unwritten = series.count - series.confirmed
        self.counts.failed += unwritten
        self.cache.forget(key)  # the next refusal makes a new Event
        log.warning(
            "audit Event could not be written",
            extra={
                "fields": {
                    "rule": key[4],
                    "namespace": key[0],
                    "name": key[3],
                    "refusals": unwritten,
                    "attempts": attempts,
                    "error": str(exc),
                }
            },
        )

    def _unwritten(self, key: DedupKey, item: _Pending) -> int:
        """Refusals of a queued key that no Event holds yet."""
        series = self.cache.get(key, self.monotonic())
        return item.count + (series.count - series.confirmed if series is not None else 0)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Stop taking refusals, write the queued ones for at most ``timeout`` seconds,
        then stop the worker; what is still queued then is counted as dropped."""
        self._closing = True
        self._wake.set()
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(worker), timeout)
            except TimeoutError:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        left = sum(self._unwritten(key, item) for key, item in self.pending.items())
        self.counts.dropped += left
        self.pending.clear()
        if self._executor is not None:
            # A call still on the wire ends by its own timeout; nobody waits for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class SinkMetrics(Collector):
    """The stdout and Events sinks' counters, read at every scrape."""

    def __init__(self, stdout: StdoutSink | None, events: EventsSink | None) -> None:
        self.stdout = stdout
        self.events = events

    def collect(self) -> Iterator[Metric]:
        if self.stdout is not None:
            lines = CounterMetricFamily(
                "holdwarden_webhook_audit_stdout_lines",
                "Audit lines by outcome on standard output: written; late (the refusal was "
                "answered before its line was written); dropped (queue full); failed",
                labels=["outcome"],
            )
            stdout = self.stdout
            for outcome, value in (
                ("written", stdout.lines),
                ("late", stdout.late),
                ("dropped", stdout.dropped),
                ("failed", stdout.failed),
            ):
                lines.add_metric([outcome], value)
            yield lines
        if self.events is not None:
            counts = self.events.counts
            events = CounterMetricFamily(
                "holdwarden_webhook_audit_events",
                "Refusals and Event writes of the Events sink by outcome: created, updated "
                "(Event writes); deduplicated, dropped, failed, dry_run (refusals)",
                labels=["outcome"],
            )
            for outcome, value in (
                ("created", counts.created),
                ("updated", counts.updated),
                ("deduplicated", counts.deduplicated),
                ("dropped", counts.dropped),
                ("failed", counts.failed),
                ("retried", counts.retried),
                ("dry_run", counts.dry_run),
            ):
                events.add_metric([outcome], value)
            yield events
            errors = CounterMetricFamily(
                "holdwarden_webhook_audit_event_errors",
                "Failed Event writes by HTTP status (unreachable: no answer)",
                labels=["status"],
            )
            for status, value in sorted(counts.by_error.items()):
                errors.add_metric([status], value)
            yield errors
            yield GaugeMetricFamily(
                "holdwarden_webhook_audit_events_queued",
                "Distinct refusals waiting to be written as Events",
                value=self.events.queued,
            )


# --- reading them back: holdwarden audit --from-cluster ---------------------------------

LIST_PAGE = 500


def read_cluster_events(
    api: Any,
    labels: EventLabels,
    *,
    namespace: str | None,
    timeout: float,
    page: int = LIST_PAGE,
) -> list[dict[str, Any]]:
    """The records of the enforcer's Events (label ``P/audit=refusal``) in ``namespace``
    (None: every namespace), oldest last refusal first. Each list call is bounded by
    ``timeout``; pages of ``page`` Events are followed to the end."""
    import json

    from kubernetes import client as k8s

    events = k8s.EventsV1Api(api)
    selector = f"{labels.audit}=refusal"
    records: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {
            "label_selector": selector,
            "limit": page,
            "_request_timeout": timeout,
            "_preload_content": False,
        }
        if token:
            kwargs["_continue"] = token
        response: Any  # a raw urllib3 response (_preload_content=False)
        if namespace is None:
            response = events.list_event_for_all_namespaces(**kwargs)
        else:
            response = events.list_namespaced_event(namespace, **kwargs)
        try:
            data = json.loads(response.data)
        finally:
            response.release_conn()
        records.extend(record_from_event(item, labels) for item in data.get("items") or [])
        token = (data.get("metadata") or {}).get("continue")
        if not token:
            break
    records.sort(key=lambda record: str(record.get("time") or ""))
    return records
