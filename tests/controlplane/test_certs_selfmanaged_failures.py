"""Self-managed certificates when things go wrong: no apiserver, a Secret with bad
contents, the leader going away (the last two on the real kube-apiserver)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kubernetes import client as k8s

from holdwarden.certs.selfmanaged import SelfManagedTLS
from holdwarden.cli.enforcer import STOP_GRACE_SECONDS, TLS_STOP_SECONDS
from holdwarden.cli.serve import verify_enforcer
from holdwarden.config import CertificatesConfig, Config, WebhookConfig
from holdwarden.leaderelection import ElectionTiming
from rig.localcluster import LocalCluster
from rig.localcluster.ports import free_port
from tests.controlplane.test_certs_selfmanaged import (
    config_for,
    fresh_scene,
    refused_probe,
    settings,
    sole_leader,
    start_replica,
    wait_for,
    webhook_configuration,
)
from tests.support.netfaults import FreezableProxy

FAST_LEASE = ElectionTiming(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


@pytest.fixture
def setup(cluster: LocalCluster, admin_client: k8s.ApiClient) -> Iterator[tuple[str, str]]:
    yield from fresh_scene(cluster, admin_client)


async def test_no_apiserver_is_retried_with_backoff_and_never_ends_the_watch() -> None:
    """Every request fails (nothing listens on the port): the watch logs, counts and tries
    again, the source stays unready with the reason, and cancelling it ends it promptly."""
    configuration = k8s.Configuration(host=f"https://127.0.0.1:{free_port()}")
    api = k8s.ApiClient(configuration)
    certs = CertificatesConfig(
        mode="self-managed", namespace="nowhere", interval=timedelta(milliseconds=100)
    )
    config = Config(webhook=WebhookConfig(certificates=certs))
    tls = SelfManagedTLS(config, api, verify=verify_enforcer, identity="lonely", timing=FAST_LEASE)
    task = asyncio.create_task(tls.watch())
    try:
        deadline = time.monotonic() + 20
        while tls.errors < 3:
            assert not task.done(), task
            assert time.monotonic() < deadline, "no failed sync was counted"
            await asyncio.sleep(0.05)
        reason = tls.unready_reason()
        assert reason is not None and "sync failed" in reason and "127.0.0.1" in reason, reason
        assert tls.not_after is None
    finally:
        task.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 15
        api.close()  # type: ignore[no-untyped-call]


@pytest.mark.controlplane
def test_a_bad_secret_is_named_and_never_overwritten_and_deleting_it_recovers(
    setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    namespace, token = setup
    port = free_port()
    certs = settings(namespace, token)
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    core = k8s.CoreV1Api(admin_client)
    junk = base64.b64encode(b"not a key").decode()
    body: Any = {
        "metadata": {"name": certs.secret_name},
        "data": {"ca.crt": junk, "ca.key": junk, "tls.crt": junk, "tls.key": junk},
    }
    created: Any = core.create_namespaced_secret(namespace, body, _request_timeout=30)
    replica = start_replica(config_for(certs, port, tmp_path), admin_client, "bad")
    try:
        where = f"Secret {namespace}/{certs.secret_name} key 'ca.crt'"
        wait_for("the error named", lambda: where in (replica.tls.unready_reason() or ""), 30)
        wait_for("leader", replica.tls.elector.is_leader, 30)
        time.sleep(4 * certs.interval.total_seconds())
        again: Any = core.read_namespaced_secret(certs.secret_name, namespace, _request_timeout=30)
        assert again.metadata.resource_version == created.metadata.resource_version
        assert replica.tls.writes == {}
        assert not replica.ready()
        # Deleting it is the documented way out: the leader makes a new one.
        core.delete_namespaced_secret(certs.secret_name, namespace, _request_timeout=30)
        wait_for("ready after the Secret was deleted", replica.ready, 60)
        wait_for("enforced", lambda: refused_probe(admin_client, namespace) == "refused", 30)
    finally:
        replica.stop()


@pytest.mark.controlplane
def test_when_the_leader_stops_the_other_replica_takes_over_the_renewals(
    setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    namespace, token = setup
    ports = [free_port(), free_port()]
    # Serving certificates of 30 s renewed from 10 s on: the writer is needed all along.
    certs = msgspec.structs.replace(
        settings(namespace, token),
        validity=timedelta(seconds=30),
        renew_before=timedelta(seconds=20),
    )
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, ports)
    )
    replicas = [
        start_replica(config_for(certs, port, tmp_path), admin_client, f"r{i}")
        for i, port in enumerate(ports)
    ]
    stopped: list[int] = []
    try:
        wait_for("both ready", lambda: all(r.ready() for r in replicas), 60)
        leader = replicas.index(sole_leader(replicas))
        replicas[leader].stop()
        stopped.append(leader)
        survivor = replicas[1 - leader]
        assert survivor.tls.writes == {}
        # The Lease was released on stop: the survivor takes it at its next try.
        wait_for("survivor leads", survivor.tls.elector.is_leader, 10)
        wait_for("survivor renews", lambda: survivor.tls.writes.get("renew", 0) >= 1, 40)
        assert survivor.ready(), survivor.tls.unready_reason()
        assert survivor.tls.errors == 0, survivor.tls.last_error
    finally:
        for i, replica in enumerate(replicas):
            if i not in stopped:
                replica.stop()


@pytest.mark.controlplane
def test_a_leader_whose_apiserver_goes_silent_still_stops_in_seconds(
    setup: tuple[str, str], cluster: LocalCluster, admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    """The Lease's production timings, so a campaign request may take 10 s. The path to the
    apiserver goes silent while this replica leads; its stop() must still end, the Lease
    elector stopped, within its bound, since the Pod's grace period leaves 5 s after the
    drain. Before, the end of the certificate watch waited up to 10 s for the campaign step
    on the wire and then up to 10 s for each of the Lease release's two requests, so the
    replica still counted itself the leader when stop() had given up on it."""
    namespace, token = setup
    proxy = FreezableProxy.in_front_of(cluster.server_url)
    configuration = cluster.configuration()
    configuration.host = proxy.url
    api = k8s.ApiClient(configuration)
    port = free_port()
    certs = settings(namespace, token)
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    replica = start_replica(config_for(certs, port, tmp_path), api, "silenced", ElectionTiming())
    stopped = False
    try:
        wait_for("ready", replica.ready, 60)
        wait_for("leader", replica.tls.elector.is_leader, 30)
        proxy.freeze()
        # The next campaign step (every 2 s) and certificate sync now wait on the wire.
        time.sleep(2.5)
        started = time.monotonic()
        replica.stop()
        stopped = True
        took = time.monotonic() - started
        assert took < STOP_GRACE_SECONDS + TLS_STOP_SECONDS + 2.0, took
        assert not replica.tls.elector.is_leader()
        # The campaign step that was on the wire gets its answer now; it must not make the
        # stopped replica the leader again.
        proxy.thaw()
        wait_for("campaign ended", lambda: not replica.tls.elector.campaigning(), 30)
        assert not replica.tls.elector.is_leader()
    finally:
        if not stopped:
            replica.stop()
        proxy.close()
        api.close()  # type: ignore[no-untyped-call]
