"""The readmission gate's process (``holdwarden gate``, holdwarden/cli/gate.py): the gate
(readmission/controller.py: informers, work queue and worker in threads, leader election)
and a small HTTP site on ``readmission.metricsAddress``:

- GET /metrics: the gate's Prometheus metrics (readmission/metrics.py), its own registry;
- GET /healthz (liveness): 200 while the gate's threads (the worker, each informer) run;
  it asks nothing of the apiserver, so an apiserver outage does not restart the Pod;
- GET /readyz (readiness): 200 once every watch cache has had its first LIST, until
  SIGTERM. Followers are ready too: they keep warm caches to take over the Lease.

SIGTERM or SIGINT stops it within ``GATE_STOP_SECONDS`` (the Lease is released, so a
follower takes over at once rather than after ``readmission.leaseDuration``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from kubernetes import client as k8s
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from holdwarden.cli.stopping import stop_waiter
from holdwarden.config import Config, split_address
from holdwarden.readmission.controller import ReadmissionGate

log = logging.getLogger("holdwarden.readmission")

# How long the gate may take to stop (readmission/controller.py: worker, Lease, watches),
# within the Pod's termination grace period.
GATE_STOP_SECONDS = 5.0


class GateServer:
    """The gate and its metrics/health site, started and stopped together. A port of 0
    binds a free one; ``metrics_port`` says which."""

    def __init__(
        self, config: Config, api_client: k8s.ApiClient, *, identity: str | None = None
    ) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.gate = ReadmissionGate(config, api_client, registry=self.registry, identity=identity)
        self.stopping = False
        self.metrics_port = 0
        self._runner: web.AppRunner | None = None

    def unready_reason(self) -> str | None:
        """Why /readyz must fail now, or None."""
        if self.stopping:
            return "shutting down"
        if not self.gate.alive():
            return "the gate is not running"
        if not self.gate.synced():
            waiting = [inf.name for inf in self.gate.informers if not inf.synced.is_set()]
            return "waiting for the first list of " + ", ".join(waiting)
        return None

    def app(self) -> web.Application:
        registry = self.registry

        async def scrape(_: web.Request) -> web.Response:
            response = web.Response(body=generate_latest(registry))
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        async def healthz(_: web.Request) -> web.Response:
            if self.stopping or self.gate.alive():
                return web.Response(text="ok\n")
            return web.Response(status=503, text="not alive: a gate thread has ended\n")

        async def readyz(_: web.Request) -> web.Response:
            reason = self.unready_reason()
            if reason is None:
                return web.Response(text="ready\n")
            return web.Response(status=503, text=f"not ready: {reason}\n")

        app = web.Application()
        app.add_routes(
            [web.get("/metrics", scrape), web.get("/healthz", healthz), web.get("/readyz", readyz)]
        )
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        host, port = split_address(self.config.readmission.metrics_address)
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.metrics_port = int(address[1])
                break
        self.gate.start()
        log.info(
            "readmission gate started",
            extra={
                "fields": {
                    "interval": str(self.config.readmission.interval),
                    "identity": self.gate.identity,
                    "metrics": f"{host}:{self.metrics_port}",
                }
            },
        )

    async def stop(self) -> None:
        self.stopping = True
        await asyncio.to_thread(self.gate.stop, timeout=GATE_STOP_SECONDS)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


async def run_gate(
    config: Config,
    api_client: k8s.ApiClient,
    *,
    until: Callable[[], Awaitable[None]] | None = None,
    identity: str | None = None,
) -> None:
    """Run the gate until SIGTERM/SIGINT (or until ``until()`` returns), then stop it."""
    server = GateServer(config, api_client, identity=identity)
    stopped = stop_waiter(until, log)
    await server.start()
    try:
        await stopped()
    finally:
        await server.stop()
