"""The enforcer's process (``holdwarden serve``, holdwarden/cli/serve.py): the admission app
(webhook/server.py) on its TLS site with the transport limits (webhook/connections.py),
the metrics app on its own port, the audit trail and its sinks, the certificates (certs/),
the drain. The readmission gate is not here: ``holdwarden gate`` (holdwarden/cli/gate.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from holdwarden.cli.serve import verify_enforcer
from holdwarden.cli.stopping import stop_waiter
from holdwarden.config import Config, EventLoop, split_address
from holdwarden.webhook.audit import AuditWriter
from holdwarden.webhook.audit_sinks import (
    EventsClient,
    EventsSink,
    KubeEvents,
    SinkMetrics,
    StdoutSink,
)
from holdwarden.webhook.connections import (
    LINGERING_TIME,
    MAX_FIELD_SIZE,
    MAX_HEADERS,
    MAX_LINE_SIZE,
    PAYLOAD_BUFFER,
    ConnectionGuard,
    GuardedTLSSite,
    Limits,
    harden_tls,
)
from holdwarden.webhook.metrics import Metrics
from holdwarden.webhook.server import RecordSink, State, TLSSource, build_app, build_metrics_app

log = logging.getLogger("holdwarden.webhook")

SWITCH_INTERVAL = 0.0005

# How long the Events sink may write its queue at shutdown; the rest is counted as dropped.
SINK_DRAIN_SECONDS = 2.0
# stop() comes after the drain, so what is still in flight then is past its drainTimeout:
# a request gets this long to be answered before its handler is cancelled (aiohttp's
# default is 60 s, waited twice per connection). After a drain nothing is in flight, and
# stop() is bounded by TLS_STOP_SECONDS plus the sinks' drains (1 s and SINK_DRAIN_SECONDS),
# within the 5 s the Pod's grace period leaves after the drain.
STOP_GRACE_SECONDS = 1.0
# How long stop() waits for the certificate watch to end, Lease release included.
TLS_STOP_SECONDS = 2.0


def load_tls(config: Config) -> TLSSource:
    if config.webhook.certificates.mode == "self-managed":
        # The Secret and the caBundle, through the API (certs/selfmanaged.py).
        from holdwarden.certs.selfmanaged import SelfManagedTLS
        from holdwarden.kubeclient import KubeconfigError, api_client

        try:
            client = api_client()
        except KubeconfigError as exc:
            # An OSError, so `holdwarden serve` reports it and exits 1 like a bad port.
            raise OSError(f"self-managed certificates need API credentials: {exc}") from exc
        return SelfManagedTLS(config, client, verify=verify_enforcer)
    from holdwarden.certs.reload import ReloadingTLS

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
        tls = self.state.tls if self.state.tls is not None else load_tls(self.config)
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
                    # The loop serving, as run (webhook.eventLoop picks it in serve).
                    "eventLoop": type(asyncio.get_running_loop()).__module__.split(".")[0],
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


def event_loop_factory(name: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``webhook.eventLoop`` names, as ``asyncio.Runner``'s loop factory:
    uvloop's, or None for asyncio's own. The TLS port (webhook/connections.py) uses only
    the loop's public calls, so its limits hold on either."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


async def run_server(config: Config, *, until: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or until ``until()`` returns), then shut down cleanly.

    The readmission gate is not started here: it is its own process (``holdwarden gate``,
    holdwarden/cli/gate.py) and its own Deployment.
    """
    server = EnforcerServer(config)
    stopped = stop_waiter(until, log, on_hangup=server.reopen_logs)
    await server.start()
    try:
        await stopped()
        await server.drain()
    finally:
        await server.stop()
