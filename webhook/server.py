"""The enforcer's admission app: the handler, the admission app and the metrics app.

The process that serves them (TLS site, drain, audit writer, certificates) is assembled by
``holdwarden serve`` (holdwarden/cli/serve.py); this module knows nothing of certificates
or of the readmission gate.

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
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
from aiohttp import HttpVersion11, web

from holdwarden.config import Config
from holdwarden.vocabulary import KUEUE_NAMESPACE_PATH, TRAINJOB, WORKLOAD
from holdwarden.webhook.audit import AuditWriter, audit_record
from holdwarden.webhook.connections import (
    BodyBudget,
    ConnectionGuard,
)
from holdwarden.webhook.metrics import CONTENT_TYPE, Metrics
from holdwarden.webhook.review import (
    BadReview,
    Review,
    allow_bytes,
    bad_request_body,
    deny,
    internal_error,
    parse_review,
)
from holdwarden.webhook.rules import RulesConfig, Violation, evaluate, skip_reason

log = logging.getLogger("holdwarden.webhook")

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
    """What the serving process needs of its certificates (``holdwarden.certs.reload.ReloadingTLS``,
    ``holdwarden.certs.selfmanaged.SelfManagedTLS``)."""

    @property
    def ssl_context(self) -> ssl.SSLContext: ...

    @property
    def not_after(self) -> datetime | None: ...

    async def watch(self) -> None: ...


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
