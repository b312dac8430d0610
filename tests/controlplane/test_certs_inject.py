"""holdwarden.certs.inject against the real kube-apiserver, and the whole certificate story end to
end: the apiserver calls a TLS server through a caBundle we injected, across a rotation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.bundle import (
    CA_BUNDLE,
    TLS_CERT,
    TLS_KEY,
    load_cert_dir,
    write_cert_dir,
    write_serving,
)
from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.inject import MAX_ATTEMPTS, InjectError, inject_ca_bundle
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.certs.rotate import prune, renew_serving, rotate_ca
from holdwarden.cli import main
from rig.localcluster import LocalCluster

pytestmark = pytest.mark.controlplane

# A label no object carries: the throwaway webhooks below must never be called.
NEVER = {"holdwarden.io/certs-test-never": "true"}
# The label of the objects the rotation test's probe webhook is called for.
PROBE = {"holdwarden.io/certs-test-probe": "true"}
# How long the apiserver may take to act on a changed webhook configuration.
CHANGE_SEEN_SECONDS = 30.0
# What the rotation test's probe write returns when no webhook refused it.
ALLOWED = "allowed: no webhook refused the write"


def _webhook(name: str, url: str, **overrides: Any) -> k8s.V1ValidatingWebhook:
    fields: dict[str, Any] = {
        "name": name,
        "admission_review_versions": ["v1"],
        "side_effects": "None",
        "failure_policy": "Ignore",
        "timeout_seconds": 5,
        "client_config": k8s.AdmissionregistrationV1WebhookClientConfig(url=url),
        "object_selector": k8s.V1LabelSelector(match_labels=NEVER),
        "rules": [
            k8s.V1RuleWithOperations(
                api_groups=[""],
                api_versions=["v1"],
                operations=["CREATE"],
                resources=["configmaps"],
            )
        ],
    }
    fields.update(overrides)
    return k8s.V1ValidatingWebhook(**fields)


@pytest.fixture
def webhook_config(admin_client: k8s.ApiClient) -> Iterator[str]:
    """A throwaway ValidatingWebhookConfiguration with two webhooks that are never called."""
    name = f"certs-test-{uuid.uuid4().hex[:8]}"
    api = k8s.AdmissionregistrationV1Api(admin_client)
    api.create_validating_webhook_configuration(
        k8s.V1ValidatingWebhookConfiguration(
            metadata=k8s.V1ObjectMeta(name=name),
            webhooks=[
                _webhook("a.certs-test.holdwarden.io", "https://127.0.0.1:1/a"),
                _webhook("b.certs-test.holdwarden.io", "https://127.0.0.1:1/b"),
            ],
        )
    )
    yield name
    api.delete_validating_webhook_configuration(name)


def _read(admin_client: k8s.ApiClient, name: str) -> Any:
    return k8s.AdmissionregistrationV1Api(admin_client).read_validating_webhook_configuration(name)


def _bundles(config: Any) -> list[bytes | None]:
    return [
        base64.b64decode(w.client_config.ca_bundle) if w.client_config.ca_bundle else None
        for w in config.webhooks
    ]


def test_inject_sets_every_webhook_and_is_idempotent(
    admin_client: k8s.ApiClient, webhook_config: str
) -> None:
    first = generate_ca().cert_pem
    assert inject_ca_bundle(admin_client, webhook_config, first) == 2
    config = _read(admin_client, webhook_config)
    assert _bundles(config) == [first, first]
    version = config.metadata.resource_version

    # Same bundle again: nothing to change, nothing written.
    assert inject_ca_bundle(admin_client, webhook_config, first) == 0
    assert _read(admin_client, webhook_config).metadata.resource_version == version

    both = generate_ca().cert_pem + first
    assert inject_ca_bundle(admin_client, webhook_config, both) == 2
    assert _bundles(_read(admin_client, webhook_config)) == [both, both]


def test_inject_changes_only_webhooks_that_differ(
    admin_client: k8s.ApiClient, webhook_config: str
) -> None:
    bundle = generate_ca().cert_pem
    config = _read(admin_client, webhook_config)
    config.webhooks[0].client_config.ca_bundle = base64.b64encode(bundle).decode()
    k8s.AdmissionregistrationV1Api(admin_client).replace_validating_webhook_configuration(
        webhook_config, config
    )
    assert inject_ca_bundle(admin_client, webhook_config, bundle) == 1
    assert _bundles(_read(admin_client, webhook_config)) == [bundle, bundle]


def test_inject_names_a_missing_configuration(admin_client: k8s.ApiClient) -> None:
    with pytest.raises(InjectError, match="ValidatingWebhookConfiguration 'no-such-config'") as e:
        inject_ca_bundle(admin_client, "no-such-config", generate_ca().cert_pem)
    assert e.value.not_found
    with pytest.raises(ValueError, match="no PEM certificate"):
        inject_ca_bundle(admin_client, "no-such-config", b"not a bundle")


def _interfering_reads(
    monkeypatch: pytest.MonkeyPatch, admin_client: k8s.ApiClient, times: int
) -> list[int]:
    """Make the next ``times`` reads stale: right after each read, someone else writes.

    The write is a real update through the real apiserver (a label change), so the
    preconditioned update that follows gets a real 409 Conflict.
    """
    original = k8s.AdmissionregistrationV1Api.read_validating_webhook_configuration
    reads: list[int] = []

    def read_then_interfere(self: Any, name: str, **kwargs: Any) -> Any:
        result = original(self, name, **kwargs)
        reads.append(1)
        if len(reads) <= times:
            other: Any = original(k8s.AdmissionregistrationV1Api(admin_client), name)
            other.metadata.labels = {**(other.metadata.labels or {}), f"other-{len(reads)}": "x"}
            k8s.AdmissionregistrationV1Api(admin_client).replace_validating_webhook_configuration(
                name, other
            )
        return result

    monkeypatch.setattr(
        k8s.AdmissionregistrationV1Api,
        "read_validating_webhook_configuration",
        read_then_interfere,
    )
    return reads


def test_inject_retries_on_conflict_and_keeps_the_other_writers_change(
    admin_client: k8s.ApiClient, webhook_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _interfering_reads(monkeypatch, admin_client, times=2)
    bundle = generate_ca().cert_pem
    assert inject_ca_bundle(admin_client, webhook_config, bundle) == 2
    assert len(reads) == 3  # two 409s, then success
    monkeypatch.undo()
    config = _read(admin_client, webhook_config)
    assert _bundles(config) == [bundle, bundle]
    assert config.metadata.labels == {"other-1": "x", "other-2": "x"}  # not overwritten


def test_inject_gives_up_after_repeated_conflicts(
    admin_client: k8s.ApiClient, webhook_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _interfering_reads(monkeypatch, admin_client, times=MAX_ATTEMPTS)
    with pytest.raises(InjectError, match=f"409 Conflict {MAX_ATTEMPTS} times"):
        inject_ca_bundle(admin_client, webhook_config, generate_ca().cert_pem)
    assert len(reads) == MAX_ATTEMPTS
    monkeypatch.undo()
    assert _bundles(_read(admin_client, webhook_config)) == [None, None]


def test_cli_inject(
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    webhook_config: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_bytes(generate_ca().cert_pem)
    argv = ["certs", "inject", "--kubeconfig", str(cluster.kubeconfig_path)]
    assert main([*argv, "--webhook-config", webhook_config, "--ca-bundle", str(bundle)]) == 0
    assert "2 webhook(s) updated with 1 CA certificate(s)" in capsys.readouterr().out
    assert _bundles(_read(admin_client, webhook_config)) == [bundle.read_bytes()] * 2

    assert main([*argv, "--webhook-config", "missing-config", "--ca-bundle", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "ValidatingWebhookConfiguration 'missing-config' does not exist" in err
    assert "Traceback" not in err


async def test_apiserver_trusts_the_webhook_across_a_rotation(
    admin_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """generate -> inject -> rotate CA -> inject both -> renew (hot reload) -> prune -> inject.

    The apiserver itself calls our TLS server at every step; the webhook denies with the
    fingerprint it is serving, so a denial carrying it proves the call got through TLS
    (a TLS failure would be denied too, failurePolicy Fail, but with the apiserver's text).

    A second webhook of the same configuration (so the same injected bundle, delivered to
    the apiserver in the same object) calls a probe server only for labelled objects: with
    a certificate of the new CA it tells when the apiserver trusts the new chain, with one
    of the old CA when it no longer does.
    """
    ca = generate_ca()
    write_cert_dir(tmp_path, ca, generate_serving(ca, "hw", "ns", ip_addresses=["127.0.0.1"]))
    tls = ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe_of_old_ca = generate_serving(ca, "probe", "ns", ip_addresses=["127.0.0.1"])
    write_serving(probe_dir, probe_of_old_ca)
    probe_tls = ReloadingTLS(probe_dir / TLS_CERT, probe_dir / TLS_KEY)

    # The connection (its transport, kept alive here so no id is reused) of every call.
    callers: list[Any] = []

    def denying(what: str, served: ReloadingTLS) -> web.Application:
        async def validate(request: web.Request) -> web.Response:
            review = json.loads(await request.read())
            callers.append(request.transport)
            message = f"{what} {served.loaded_fingerprint}"
            response = web.json_response(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": review["request"]["uid"],
                        "allowed": False,
                        "status": {"code": 403, "message": message},
                    },
                }
            )
            # Every call on a connection of its own: the fingerprint reported is then the
            # one the apiserver's fresh handshake verified, never one of a kept-alive
            # connection made before the reload.
            response.force_close()
            return response

        app = web.Application()
        app.router.add_post("/validate", validate)
        return app

    runners: list[web.AppRunner] = []

    async def start(app: web.Application, served: ReloadingTLS) -> int:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=served.ssl_context).start()
        port: int = runner.addresses[0][1]
        return port

    port = await start(denying("served", tls), tls)
    probe_port = await start(denying("probe", probe_tls), probe_tls)
    watcher = asyncio.create_task(tls.watch(0.05))
    name = f"certs-e2e-{uuid.uuid4().hex[:8]}"
    registration = k8s.AdmissionregistrationV1Api(admin_client)
    in_namespace = k8s.V1LabelSelector(match_labels={"kubernetes.io/metadata.name": namespace})
    hook = _webhook(
        "e2e.certs-test.holdwarden.io",
        f"https://127.0.0.1:{port}/validate",
        failure_policy="Fail",
        object_selector=k8s.V1LabelSelector(
            match_expressions=[
                k8s.V1LabelSelectorRequirement(key=next(iter(PROBE)), operator="DoesNotExist")
            ]
        ),
        namespace_selector=in_namespace,
    )
    probe_hook = _webhook(
        "probe.certs-test.holdwarden.io",
        f"https://127.0.0.1:{probe_port}/validate",
        failure_policy="Fail",
        object_selector=k8s.V1LabelSelector(match_labels=PROBE),
        namespace_selector=in_namespace,
    )

    def inject() -> None:
        inject_ca_bundle(admin_client, name, (tmp_path / CA_BUNDLE).read_bytes())

    async def refusal(labels: dict[str, str] | None) -> str:
        """Create a ConfigMap; return the apiserver's refusal message, or ``ALLOWED`` if
        the write went through (no webhook was called: a configuration the apiserver has
        not loaded yet). ``ALLOWED`` matches none of the refusals the test waits for or
        asserts, so it fails them, with itself in the message."""

        def create() -> str:
            body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(generate_name="probe-", labels=labels))
            try:
                k8s.CoreV1Api(admin_client).create_namespaced_config_map(namespace, body)
            except ApiException as exc:
                return str(json.loads(exc.body or "{}").get("message", exc.reason))
            return ALLOWED

        # The Kubernetes client blocks; keep the event loop (and our servers) running.
        return await asyncio.to_thread(create)

    async def denial() -> str:
        return await refusal(None)

    async def probe() -> str:
        return await refusal(PROBE)

    async def until(ask: Callable[[], Awaitable[str]], ok: Callable[[str], bool]) -> None:
        """Ask until the answer is ``ok``, bounded: the apiserver learns of a configuration
        change through its informer, which a starved machine may delay."""
        messages: list[str] = []
        deadline = time.monotonic() + CHANGE_SEEN_SECONDS
        while True:
            messages.append(await ask())
            if ok(messages[-1]):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {CHANGE_SEEN_SECONDS} s: {messages[-3:]}")
            await asyncio.sleep(0.1)

    async def served_through_tls(fingerprint: str) -> None:
        await until(denial, lambda message: message.endswith(f"served {fingerprint}"))

    async def probe_through_tls(fingerprint: str) -> None:
        await until(probe, lambda message: message.endswith(f"probe {fingerprint}"))

    async def probe_refused_by_tls() -> None:
        await until(probe, lambda message: "failed calling webhook" in message)

    try:
        await asyncio.to_thread(
            registration.create_validating_webhook_configuration,
            k8s.V1ValidatingWebhookConfiguration(
                metadata=k8s.V1ObjectMeta(name=name), webhooks=[hook, probe_hook]
            ),
        )
        # Before injection the apiserver cannot verify our server (once it has loaded the
        # configuration: until then the write is allowed).
        await until(denial, lambda message: "failed calling webhook" in message)
        await asyncio.to_thread(inject)
        await served_through_tls(tls.loaded_fingerprint)

        old = tls.loaded_fingerprint
        rotation = rotate_ca(tmp_path)
        write_serving(
            probe_dir, generate_serving(rotation.ca, "probe", "ns", ip_addresses=["127.0.0.1"])
        )
        assert probe_tls.reload_if_changed()
        await asyncio.to_thread(inject)  # both CAs
        await served_through_tls(old)
        # Before we switch: the apiserver has the two-CA bundle once it trusts the probe's
        # certificate of the new CA (no call to it got through before the injection).
        await probe_through_tls(probe_tls.loaded_fingerprint)
        new = renew_serving(tmp_path, "hw", "ns")
        deadline = time.monotonic() + 10
        while tls.loaded_fingerprint != new.fingerprint:  # reloaded within 0.05 s, unstarved
            assert time.monotonic() < deadline, "the renewed certificate was not reloaded"
            await asyncio.sleep(0.02)
        # No gap: the very next call gets through.
        assert (await denial()).endswith(f"served {new.fingerprint}")

        assert len(prune(tmp_path)) == 1
        write_serving(probe_dir, probe_of_old_ca)
        assert probe_tls.reload_if_changed()
        await asyncio.to_thread(inject)
        # The apiserver has the pruned bundle once it refuses the old CA's certificate.
        await probe_refused_by_tls()
        assert (await denial()).endswith(f"served {new.fingerprint}")
        assert len(load_cert_dir(tmp_path).bundle) == 1
        assert len({id(c) for c in callers}) == len(callers), "a call reused a connection"
    finally:
        await asyncio.to_thread(registration.delete_validating_webhook_configuration, name)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        for runner in runners:
            await runner.cleanup()
