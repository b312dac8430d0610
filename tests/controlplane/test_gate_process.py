"""``holdwarden gate``, the readmission gate's own process (holdwarden/cli/gate.py and
gateserver.py), without an apiserver: its health and metrics endpoints, its flags.

The gate against the real control plane, as a subprocess (Ready, its /metrics, SIGTERM):
tests/controlplane/test_readmission_kube.py::test_holdwarden_gate_runs_the_gate_in_its_own_process.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
import pytest
from kubernetes import client as k8s

from holdwarden.cli import main
from holdwarden.cli.gateserver import GateServer
from holdwarden.config import Config, TimeoutsConfig


def _unreachable_api() -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = "http://127.0.0.1:1"  # nothing listens: every LIST fails at once
    return k8s.ApiClient(configuration)


async def test_health_metrics_and_readiness_before_the_caches_fill() -> None:
    base = Config()
    config = msgspec.structs.replace(
        base,
        timeouts=TimeoutsConfig(apiserver_request=base.apiserver_request_timeout / 60),
        readmission=msgspec.structs.replace(
            base.readmission, leader_election=False, metrics_address="127.0.0.1:0"
        ),
    )
    server = GateServer(config, _unreachable_api())
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.metrics_port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/healthz") as got:
                assert (got.status, await got.text()) == (200, "ok\n")
            # No apiserver: alive (its threads retry), not ready (no cache has listed).
            async with session.get(f"{url}/readyz") as got:
                text = await got.text()
                assert got.status == 503
                assert "waiting for the first list of" in text and "pods" in text
            async with session.get(f"{url}/metrics") as got:
                scraped = await got.text()
                assert got.status == 200
                assert "holdwarden_readmission_queue_depth" in scraped
                assert "holdwarden_webhook" not in scraped  # its own registry only
        assert server.gate.alive()
    finally:
        await asyncio.wait_for(server.stop(), timeout=15)
    assert not server.gate.alive()
    assert server.unready_reason() == "shutting down"


@pytest.mark.parametrize(
    "argv",
    [["gate", "--metrics", "nowhere"], ["gate", "--metrics", "127.0.0.1:70000"]],
)
def test_a_bad_metrics_address_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("holdwarden gate: ") and "'--metrics'" in err


def test_a_bad_configuration_is_a_usage_error(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "config.yaml"
    path.write_text("readmission:\n  metricsAddress: nope\n")
    assert main(["gate", "--config", str(path)]) == 2
    assert "readmission.metricsAddress" in capsys.readouterr().err
