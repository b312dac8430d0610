"""The enforcer's HTTP(S) servers: admission on the TLS port, metrics on a separate port.

Main port (TLS):  POST /validate, GET /healthz, GET /readyz.
Metrics port:     GET /metrics, GET /healthz, GET /readyz.

Invariants of POST /validate:
  - a well-formed AdmissionReview always gets HTTP 200, its uid echoed, never a patch;
  - a body that is not one gets HTTP 400 (413 when over ``webhook.maxBodyBytes``) with a
    Kubernetes ``Status`` JSON body saying what is wrong;
  - it never answers 500 and never lets an exception escape: a review that was parsed but
    could not be judged is refused (HTTP 200, ``allowed: false``, code 500 in the status),
    which is what ``failurePolicy: Fail`` would do anyway;
  - a refusal is answered only after its audit line is durably on disk (``AuditWriter``).
/readyz is 200 only while the TLS site is serving (and, with self-managed certificates,
while the injected caBundle trusts the certificate served: certs/selfmanaged.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import ssl
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
from aiohttp import HttpVersion11, web

from holdwarden.config import Config, split_address
from holdwarden.vocabulary import KUEUE_NAMESPACE_PATH, TRAINJOB, WORKLOAD
from webhook.audit import AuditWriter, audit_record, rfc3339
from webhook.audit_sinks import EventsClient, EventsSink, KubeEvents, SinkMetrics, StdoutSink
from webhook.connections import (
    LINGERING_TIME,
    MAX_FIELD_SIZE,
    MAX_HEADERS,
    MAX_LINE_SIZE,
    PAYLOAD_BUFFER,
    BodyBudget,
    ConnectionGuard,
    GuardedTLSSite,
    Limits,
    harden_tls,
)
from webhook.metrics import CONTENT_TYPE, Metrics
from webhook.review import (
    BadReview,
    Review,
    allow_bytes,
    bad_request_body,
    deny,
    internal_error,
    parse_review,
)
from webhook.rules import RulesConfig, Violation, evaluate, skip_reason

log = logging.getLogger("holdwarden.webhook")

SWITCH_INTERVAL = 0.0005
# How long the Events sink may write its queue at shutdown; the rest is counted as dropped.
SINK_DRAIN_SECONDS = 2.0
# stop() comes after the drain, so what is still in flight then is past its drainTimeout:
# a request gets this long to be answered before its handler is cancelled (aiohttp's
# default is 60 s, waited twice per connection). After a drain nothing is in flight, and
# stop() is bounded by TLS_STOP_SECONDS plus the sinks' drains (1 s and SINK_DRAIN_SECONDS),
# within the 5 s the Pod's grace period leaves after the drain; the gate stops alongside.
STOP_GRACE_SECONDS = 1.0
# How long stop() waits for the certificate watch to end, Lease release included.
TLS_STOP_SECONDS = 2.0
# How long the readmission gate may take to stop beside it (readmission/controller.py).
GATE_STOP_SECONDS = 3.0
_KNOWN_RESOURCES = frozenset({TRAINJOB.plural, WORKLOAD.plural})
_KNOWN_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
_JSON = "application/json"
_ENCODE = msgspec.json.encode
# Pre-encoded, so answering it cannot fail.
_LAST_RESORT = _ENCODE(bad_request_body(400, "could not read the request"))


class RecordSink(Protocol):
    """An audit sink besides the file (webhook/audit_sinks.py): ``append`` returns within
    a bounded time and never raises."""

    async def append(self, record: Mapping[str, Any]) -> None: ...


class TLSSource(Protocol):
    """What the server needs from ``certs.reload.ReloadingTLS``."""

    @property
    def ssl_context(self) -> ssl.SSLContext: ...

    @property
    def not_after(self) -> datetime | None: ...

    async def watch(self) -> None: ...


# --- structured logs ---------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, msg, and the record's
    ``fields`` extra (a dict) merged in."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["error"] = "".join(traceback.format_exception(*record.exc_info)).strip()
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure_logging(level: int = logging.INFO) -> None:
    """Send every log record to stderr as a JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


# --- the admission handler ---------------------------------------------------------------


@dataclass
class State:
    """Mutable server state shared by both apps."""

    ready: bool = False
    draining: bool = False  # SIGTERM came: /readyz fails while the server drains
    tls: TLSSource | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Each returns why the server must not be ready now (e.g. the audit log cannot be
    # written), or None; /readyz fails while any says so.
    unready_checks: list[Callable[[], str | None]] = field(default_factory=list)


def _label(value: str, known: frozenset[str]) -> str:
    # Bounded label values: a fuzzer or a misregistered webhook must not blow up cardinality.
    return value if value in known else "other"


class Enforcer:
    """Judges admission reviews; one per app."""

    def __init__(
        self,
        config: Config,
        audit: AuditWriter,
        metrics: Metrics,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sinks: Sequence[RecordSink] = (),
    ) -> None:
        self.config = config
        self.rules = RulesConfig.from_config(config)
        # The second webhook entry's requests (KUEUE_NAMESPACE_PATH): its namespaceSelector
        # is Kueue's managedJobsNamespaceSelector, so every TrainJob there is Kueue's.
        self.kueue_namespace_rules = dataclasses.replace(self.rules, kueue_managed_namespace=True)
        self.audit = audit
        # The file sink is on unless webhook.auditSinks leaves it out; the others
        # (webhook/audit_sinks.py) count their own failures and never raise.
        self.file_audit = "file" in config.webhook.audit_sinks
        self.sinks = tuple(sinks)
        self.metrics = metrics
        self.clock = clock
        self.max_body = config.webhook.max_body_bytes
        self.body_timeout = config.webhook.body_timeout.total_seconds()
        self.budget = BodyBudget(config.webhook.max_in_flight_body_bytes)

    @staticmethod
    def _json(status: int, body: dict[str, Any]) -> web.Response:
        return web.Response(status=status, body=_ENCODE(body), content_type=_JSON)

    def _bad(self, status: int, message: str, started: float) -> web.Response:
        log.warning(
            "bad admission request", extra={"fields": {"status": status, "reason": message}}
        )
        self.metrics.observe("", "", "invalid", "", time.perf_counter() - started)
        response = self._json(status, bad_request_body(status, message))
        if status in (408, 413):
            # The rest of the body is unread: this connection cannot carry another request.
            response.force_close()
        return response

    async def validate(self, request: web.Request) -> web.Response:
        """POST /validate."""
        return await self._answer(request, self.rules)

    async def validate_kueue_namespace(self, request: web.Request) -> web.Response:
        """POST KUEUE_NAMESPACE_PATH: the second webhook entry's requests, from namespaces
        where Kueue manages jobs without a queue name (``RulesConfig.kueue_managed_namespace``)."""
        return await self._answer(request, self.kueue_namespace_rules)

    async def _answer(self, request: web.Request, rules: RulesConfig) -> web.Response:
        started = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            return await self._validate(request, rules, started)
        except ConnectionError as exc:
            # The client went away mid-body: nobody will read an answer, and it is not a
            # bug, so one line and no traceback.
            log.info(
                "client disconnected before sending the whole body",
                extra={"fields": {"peer": _peer(request), "error": str(exc) or type(exc).__name__}},
            )
            self.metrics.observe("", "", "invalid", "", time.perf_counter() - started)
            return web.Response(status=400, body=_LAST_RESORT, content_type=_JSON)
        except Exception as exc:  # never a 500, never a crash
            try:
                log.exception("unexpected error reading an admission request")
                return self._bad(400, f"could not read the request: {type(exc).__name__}", started)
            except Exception:
                return web.Response(status=400, body=_LAST_RESORT, content_type=_JSON)
        finally:
            self.metrics.in_flight.dec()

    async def _read(self, request: web.Request) -> bytes:
        too_big = (
            f"body exceeds webhook.maxBodyBytes ({self.max_body} bytes); "
            f"an AdmissionReview this large is not expected"
        )
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            raise BadReview(413, too_big)
        want = declared if declared is not None else self.max_body
        try:
            granted = self.budget.try_acquire(want) if request.content.is_eof() else None
            if granted is not None:
                # The usual case: the whole body came with the headers, so nothing can
                # stall and no timer is needed (a timer costs ~4 us a review).
                try:
                    return await request.read()
                finally:
                    self.budget.release(granted)
            # A body must arrive within webhook.bodyTimeout, waiting for room in the
            # process's body budget included; what it holds of the budget is given back
            # once read.
            async with asyncio.timeout(self.body_timeout):
                granted = await self.budget.acquire(want)
                try:
                    return await self._read_large(request)
                finally:
                    self.budget.release(granted)
        except web.HTTPRequestEntityTooLarge:
            raise BadReview(413, too_big) from None
        except TimeoutError:
            raise BadReview(
                408,
                f"the body did not arrive within webhook.bodyTimeout ({self.body_timeout:g}s)",
            ) from None
        except web.RequestPayloadError as exc:
            # A broken chunked encoding or a truncated body: the client's fault.
            raise BadReview(400, f"could not read the body: {exc}") from None

    async def _read_large(self, request: web.Request) -> bytes:
        """The body of a request whose body was still arriving, as one bytes object.

        It keeps the chunks as they come and joins them once: one copy of the body, where
        aiohttp's ``read()`` grows a bytearray and then copies it into bytes (for a 1.5 MB
        review, a second 1.5 MB allocation and copy). The size bound is the same as
        aiohttp's (``webhook.maxBodyBytes``, also when there is no Content-Length).
        """
        content = request.content
        # As aiohttp's read() does: buffer up to the body bound before pausing the socket,
        # so a large body is not read in 16 KiB pause/resume steps.
        content.set_read_chunk_size(self.max_body)
        chunks: list[bytes] = []
        size = 0
        while chunk := await content.readany():
            size += len(chunk)
            if size > self.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=size)
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse an oversized body before the client sends it.

        aiohttp's default would answer ``100 Continue`` first, and the client would then
        send the whole body only to get the 413.
        """
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            response = self._bad(
                413,
                f"Content-Length {declared} exceeds webhook.maxBodyBytes ({self.max_body} bytes)",
                time.perf_counter(),
            )
            response.force_close()
            return response
        if request.version != HttpVersion11:
            return None
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text="only Expect: 100-continue is understood")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the answer's size
        return None

    async def _validate(
        self, request: web.Request, rules: RulesConfig, started: float
    ) -> web.Response:
        try:
            body = await self._read(request)
            review = parse_review(body)
        except BadReview as bad:
            return self._bad(bad.status, bad.message, started)
        change = review.change
        resource = _label(change.resource, _KNOWN_RESOURCES)
        operation = _label(change.operation, _KNOWN_OPERATIONS)
        try:
            reason = skip_reason(change)
            if reason is not None:
                log.info(
                    "allowed without judging",
                    extra={"fields": {"uid": review.uid, "reason": reason, **_where(review)}},
                )
                self.metrics.observe(
                    resource, operation, "skipped", "", time.perf_counter() - started
                )
                return web.Response(body=allow_bytes(review.uid), content_type=_JSON)
            violation = evaluate(change, rules)
            if violation is None:
                self.metrics.observe(
                    resource, operation, "allowed", "", time.perf_counter() - started
                )
                return web.Response(body=allow_bytes(review.uid), content_type=_JSON)
            await self._audit(review, violation, body)
            log.info(
                "refused",
                extra={
                    "fields": {
                        "uid": review.uid,
                        "rule": str(violation.rule),
                        "dryRun": review.dry_run,
                        **_where(review),
                    }
                },
            )
            self.metrics.observe(
                resource, operation, "denied", str(violation.rule), time.perf_counter() - started
            )
            return self._json(200, deny(review.uid, violation, dry_run=review.dry_run))
        except Exception as exc:
            log.exception("could not judge a review", extra={"fields": {"uid": review.uid}})
            self.metrics.observe(resource, operation, "error", "", time.perf_counter() - started)
            return self._json(200, internal_error(review.uid, type(exc).__name__))

    async def _audit(self, review: Review, violation: Violation, body: bytes) -> None:
        record = audit_record(review, violation, self.clock(), body)
        if self.file_audit:
            try:
                await self.audit.append(record)
            except OSError as exc:
                # The refusal is still the safe answer; the failure is loud in logs and
                # metrics.
                self.metrics.audit_errors.inc()
                log.error(
                    "audit line could not be written",
                    extra={"fields": {"uid": review.uid, "error": str(exc)}},
                )
        for sink in self.sinks:
            await sink.append(record)


def _peer(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


def _where(review: Review) -> dict[str, Any]:
    change = review.change
    return {
        "user": change.username,
        "operation": change.operation,
        "resource": change.resource,
        "subResource": change.subresource,
        "namespace": change.namespace,
        "name": change.name,
    }


# --- apps ----------------------------------------------------------------------------------


def _health_routes(state: State) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if state.ready:
            reasons = [r for r in (check() for check in state.unready_checks) if r is not None]
            if reasons:
                return web.Response(status=503, text="not ready: " + "; ".join(reasons) + "\n")
            return web.Response(text="ready\n")
        if state.draining:
            return web.Response(status=503, text="not ready: shutting down\n")
        return web.Response(status=503, text="not ready: TLS site is not serving yet\n")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]


def build_app(
    config: Config,
    audit: AuditWriter,
    metrics: Metrics,
    state: State | None = None,
    *,
    guard: ConnectionGuard | None = None,
    sinks: Sequence[RecordSink] = (),
) -> web.Application:
    """The admission app (POST /validate, /healthz, /readyz). ``state`` defaults to ready,
    for tests that serve it without TLS. With ``guard`` (the TLS site's), it is told of
    every answer; the handlers know nothing of connections."""
    state = state if state is not None else State(ready=True)
    enforcer = Enforcer(config, audit, metrics, sinks=sinks)
    # One byte over the limit is enough for aiohttp to refuse; the handler words the 413.
    app = web.Application(client_max_size=config.webhook.max_body_bytes)
    routes = [
        web.post("/validate", enforcer.validate, expect_handler=enforcer.expect),
        web.post(
            KUEUE_NAMESPACE_PATH, enforcer.validate_kueue_namespace, expect_handler=enforcer.expect
        ),
        *_health_routes(state),
    ]
    if guard is not None:
        # Every answer, whatever route (404 and 405 included), passes through aiohttp's
        # response-prepare signal: the guard learns there that the connection's request
        # is answered, and while draining makes the answer close its connection.
        app.on_response_prepare.append(guard.on_response_prepare)
    app.add_routes(routes)
    return app


def build_metrics_app(metrics: Metrics, state: State) -> web.Application:
    """The metrics app (GET /metrics, /healthz, /readyz) for the separate metrics port."""

    async def scrape(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    app = web.Application()
    app.add_routes([web.get("/metrics", scrape), *_health_routes(state)])
    return app


# --- running -------------------------------------------------------------------------------


def _load_tls(config: Config) -> TLSSource:
    if config.webhook.certificates.mode == "self-managed":
        # The Secret and the caBundle, through the API (certs/selfmanaged.py).
        from certs.selfmanaged import SelfManagedTLS
        from holdwarden.kubeclient import KubeconfigError, api_client

        try:
            client = api_client()
        except KubeconfigError as exc:
            # An OSError, so `holdwarden serve` reports it and exits 1 like a bad port.
            raise OSError(f"self-managed certificates need API credentials: {exc}") from exc
        return SelfManagedTLS(config, client)
    from certs.reload import ReloadingTLS

    cert_dir = config.webhook.cert_dir
    tls: TLSSource = ReloadingTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
    return tls


class EnforcerServer:
    """Both sites, the audit writer and the certificate watcher, started and stopped together.

    ``tls`` may be given (tests); otherwise it is loaded from ``<certDir>/tls.{crt,key}``.
    Ports of 0 bind a free port; ``port`` and ``metrics_port`` say which.
    """

    def __init__(
        self,
        config: Config,
        *,
        tls: TLSSource | None = None,
        audit: AuditWriter | None = None,
        metrics: Metrics | None = None,
        events_client: EventsClient | None = None,
    ) -> None:
        self.config = config
        self.state = State(tls=tls)
        self.audit = audit or AuditWriter(
            config.webhook.audit_log,
            max_bytes=config.webhook.audit_max_bytes,
            max_files=config.webhook.audit_max_files,
        )
        sinks = config.webhook.audit_sinks
        if "file" in sinks:
            self.state.unready_checks.append(self.audit.unready_reason)
        self.metrics = metrics or Metrics()
        self.stdout_sink = StdoutSink() if "stdout" in sinks else None
        # The Events sink's client: given (tests), or made at start from the in-cluster
        # credentials (or the kubeconfig outside a cluster), as the readmission gate's is.
        self._events_client = events_client
        self.events_sink: EventsSink | None = None
        self._own_events_client: KubeEvents | None = None
        self.sinks: list[RecordSink] = [] if self.stdout_sink is None else [self.stdout_sink]
        self.port = 0
        self.metrics_port = 0
        self._runners: list[web.AppRunner] = []
        self._watch: asyncio.Task[None] | None = None
        self.guard = ConnectionGuard(Limits.from_config(config.webhook))
        self._site: GuardedTLSSite | None = None

    async def start(self) -> None:
        # The audit writer thread needs the GIL for a moment after each fdatasync before the
        # refusal can be answered; with CPython's default 5 ms switch interval a busy event
        # loop would make every refusal wait up to 5 ms for it. 0.5 ms bounds that wait; it
        # only costs anything when another thread actually asks for the GIL.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._start_sinks()
        tls = self.state.tls if self.state.tls is not None else _load_tls(self.config)
        self.state.tls = tls
        # Self-managed certificates: not ready until the caBundle trusts what is served.
        tls_unready = getattr(tls, "unready_reason", None)
        if tls_unready is not None:
            self.state.unready_checks.append(tls_unready)
        self.metrics.track_certificate(lambda: tls.not_after)
        self.metrics.track_certificate_rejections(lambda: getattr(tls, "rejected", {}))
        self.metrics.track_audit(self.audit)
        self._watch = asyncio.create_task(tls.watch())

        metrics_runner = web.AppRunner(
            build_metrics_app(self.metrics, self.state),
            shutdown_timeout=STOP_GRACE_SECONDS,
            access_log=None,  # a line per scrape (every 15-30 s, forever) says nothing
        )
        await metrics_runner.setup()
        self._runners.append(metrics_runner)
        host, port = split_address(self.config.webhook.metrics_address)
        metrics_site = web.TCPSite(metrics_runner, host, port, reuse_address=True)
        await metrics_site.start()
        self.metrics_port = _bound_port(metrics_runner)

        hook = self.config.webhook
        harden_tls(tls.ssl_context, str(hook.client_ca_file) if hook.client_ca_file else None)
        self.guard.start()
        guard = self.guard
        self.metrics.track_connections(lambda: (guard.count, guard.closed_by_reason()))
        app = build_app(
            self.config, self.audit, self.metrics, self.state, guard=self.guard, sinks=self.sinks
        )
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            # aiohttp's own idle timer, a second line behind the guard's.
            keepalive_timeout=hook.idle_timeout.total_seconds(),
            lingering_time=LINGERING_TIME,
            max_headers=MAX_HEADERS,
            max_field_size=MAX_FIELD_SIZE,
            max_line_size=MAX_LINE_SIZE,
            read_bufsize=PAYLOAD_BUFFER,
            shutdown_timeout=STOP_GRACE_SECONDS,
        )
        await runner.setup()
        self._runners.append(runner)
        host, port = split_address(self.config.webhook.listen_address)
        site = GuardedTLSSite(runner, host, port, ssl_context=tls.ssl_context, guard=self.guard)
        await site.start()
        self._site = site
        self.port = site.bound_port
        self.state.ready = True
        log.info(
            "serving",
            extra={
                "fields": {
                    "listen": f"{host}:{self.port}",
                    "metrics": f"{self.config.webhook.metrics_address.rpartition(':')[0]}:"
                    f"{self.metrics_port}",
                    "auditLog": str(self.audit.path),
                    "auditSinks": list(self.config.webhook.audit_sinks),
                }
            },
        )

    def _start_sinks(self) -> None:
        hook = self.config.webhook
        if "file" in hook.audit_sinks:
            self.audit.open()
        if self.stdout_sink is not None:
            self.stdout_sink.open()
        if "events" in hook.audit_sinks:
            client = self._events_client
            if client is None:
                from holdwarden.kubeclient import api_client

                timeout = hook.audit_events.request_timeout.total_seconds()
                client = self._own_events_client = KubeEvents(api_client(), timeout)
            self.events_sink = EventsSink(
                hook.audit_events, client, annotation_prefix=self.config.annotation_prefix
            )
            self.events_sink.open()
            self.sinks.append(self.events_sink)
        if self.stdout_sink is not None or self.events_sink is not None:
            self.metrics.registry.register(SinkMetrics(self.stdout_sink, self.events_sink))

    def reopen_logs(self) -> None:
        """SIGHUP: reopen the audit log at its path (after an external rotation)."""
        log.info("reopening the audit log", extra={"fields": {"signal": "SIGHUP"}})
        self.audit.reopen()

    async def drain(self) -> None:
        """SIGTERM: stop being ready, keep serving, then finish what is in flight.

        1. /readyz fails at once, and every answer from now on closes its connection, so
           keep-alive clients move to another endpoint without a race (they read
           ``Connection: close`` before they would reuse the connection).
        2. For ``webhook.shutdownDelay`` everything is served as usual, new connections
           included, while endpoints and load balancers stop sending here.
        3. The listener closes; connections with nothing in flight are closed; a request
           that has started (its body still arriving included) is answered. All of that
           within ``webhook.drainTimeout``; whatever is left then is cut off.
        """
        hook = self.config.webhook
        self.state.ready = False
        self.state.draining = True
        self.guard.drain()
        started = time.monotonic()
        log.info(
            "draining",
            extra={
                "fields": {
                    "shutdownDelay": f"{hook.shutdown_delay.total_seconds():g}s",
                    "drainTimeout": f"{hook.drain_timeout.total_seconds():g}s",
                    "connections": self.guard.count,
                }
            },
        )
        await asyncio.sleep(hook.shutdown_delay.total_seconds())
        if self._site is not None:
            self._site.stop_listening()
        self.guard.close_idle_now()
        drained = await self.guard.wait_empty(hook.drain_timeout.total_seconds())
        cut = 0 if drained else self.guard.abort_all()
        log.info(
            "drained" if drained else "drain timed out",
            extra={
                "fields": {
                    "seconds": round(time.monotonic() - started, 3),
                    "cutOff": cut,
                }
            },
        )

    async def stop(self) -> None:
        """Stop now, whether or not ``drain()`` came first, in bounded time.

        A request in progress gets ``STOP_GRACE_SECONDS`` to be answered, then its handler
        is cancelled and any connection left (one still in its TLS handshake, say) is
        aborted; the certificate watch gets ``TLS_STOP_SECONDS`` (a Lease it holds is
        released within that); then the audit trail and its sinks are closed. So stop()
        takes seconds whatever a client or the apiserver does.
        """
        self.state.ready = False
        await self.guard.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        cut = self.guard.abort_all()
        if cut:
            log.warning("stop cut off connections", extra={"fields": {"connections": cut}})
        if self._watch is not None:
            watch, self._watch = self._watch, None
            watch.cancel()
            done, _ = await asyncio.wait({watch}, timeout=TLS_STOP_SECONDS)
            if not done:
                # Its thread ends by itself (the elector's stop is bounded too); waiting
                # for it here would spend the grace period the audit flush needs.
                log.warning("the certificate watch did not end within %gs", TLS_STOP_SECONDS)
            elif not watch.cancelled() and watch.exception() is not None:
                log.warning("the certificate watch ended with %r", watch.exception())
        await self.audit.aclose()
        # After the sites: no refusal can come any more. Each drain is bounded, and both
        # fit in the 5 s the Pod's grace period leaves after the drain (deployment.yaml).
        if self.stdout_sink is not None:
            await self.stdout_sink.aclose(timeout=1.0)
        if self.events_sink is not None:
            await self.events_sink.aclose(timeout=SINK_DRAIN_SECONDS)
        if self._own_events_client is not None:
            self._own_events_client.close()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return 0


async def run_server(config: Config, *, until: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or until ``until()`` returns), then shut down cleanly.

    With ``readmission.enabled`` the readmission gate (readmission/controller.py)
    runs beside the enforcer, with in-cluster credentials (or the kubeconfig outside one).
    """
    server = EnforcerServer(config)
    stop = asyncio.Event()
    if until is None:
        # The handlers go in before the server starts: a SIGTERM that arrives while it is
        # starting (a rollout that changes its mind, or a test that stops it right after
        # "serving") must drain and exit 0, not kill the process with the default action.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP (logrotate's postrotate) reopens the audit log; it must not end the
        # process, which is its default action.
        loop.add_signal_handler(signal.SIGHUP, server.reopen_logs)
    await server.start()
    gate = _start_readmission_gate(config, server.metrics.registry)
    try:
        if until is not None:
            await until()
        else:
            await stop.wait()
            log.info("stopping")
        await server.drain()
    finally:
        # Side by side, so the exit takes the longer of the two, not their sum.
        stopping = [server.stop()]
        if gate is not None:
            stopping.append(asyncio.to_thread(gate.stop, timeout=GATE_STOP_SECONDS))
        await asyncio.gather(*stopping)


def _start_readmission_gate(config: Config, registry: Any) -> Any:
    """Start the gate, its metrics in the enforcer's registry (one ``/metrics`` for both)."""
    if not config.readmission.enabled:
        return None
    from holdwarden.kubeclient import api_client
    from readmission.controller import ReadmissionGate

    gate = ReadmissionGate(config, api_client(), registry=registry)
    gate.start()
    fields = {"interval": str(config.readmission.interval), "identity": gate.identity}
    log.info("readmission gate started", extra={"fields": fields})
    return gate
