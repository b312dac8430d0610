"""certs.inject against the real kube-apiserver, and the whole certificate story end to end:
the apiserver calls a TLS server through a caBundle we injected, across a rotation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from certs.bundle import CA_BUNDLE, TLS_CERT, TLS_KEY, load_cert_dir, write_cert_dir
from certs.generate import generate_ca, generate_serving
from certs.inject import MAX_ATTEMPTS, InjectError, inject_ca_bundle
from certs.reload import ReloadingTLS
from certs.rotate import prune, renew_serving, rotate_ca
from holdwarden.cli import main
from rig.localcluster import LocalCluster

pytestmark = pytest.mark.controlplane

# A label no object carries: the throwaway webhooks below must never be called.
NEVER = {"holdwarden.io/certs-test-never": "true"}


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
    """
    ca = generate_ca()
    write_cert_dir(tmp_path, ca, generate_serving(ca, "hw", "ns", ip_addresses=["127.0.0.1"]))
    tls = ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)

    async def validate(request: web.Request) -> web.Response:
        review = json.loads(await request.read())
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": False,
                    "status": {"code": 403, "message": f"served {tls.loaded_fingerprint}"},
                },
            }
        )

    app = web.Application()
    app.router.add_post("/validate", validate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.ssl_context).start()
    port = runner.addresses[0][1]
    watcher = asyncio.create_task(tls.watch(0.05))
    name = f"certs-e2e-{uuid.uuid4().hex[:8]}"
    registration = k8s.AdmissionregistrationV1Api(admin_client)
    hook = _webhook(
        "e2e.certs-test.holdwarden.io",
        f"https://127.0.0.1:{port}/validate",
        failure_policy="Fail",
        object_selector=None,
        namespace_selector=k8s.V1LabelSelector(
            match_labels={"kubernetes.io/metadata.name": namespace}
        ),
    )

    def inject() -> None:
        inject_ca_bundle(admin_client, name, (tmp_path / CA_BUNDLE).read_bytes())

    async def denial() -> str:
        """Create a ConfigMap; return the apiserver's refusal message."""

        def create() -> str:
            body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(generate_name="probe-"))
            try:
                k8s.CoreV1Api(admin_client).create_namespaced_config_map(namespace, body)
            except ApiException as exc:
                return str(json.loads(exc.body or "{}").get("message", exc.reason))
            raise AssertionError("the webhook did not refuse the write")

        # The Kubernetes client blocks; keep the event loop (and our server) running.
        return await asyncio.to_thread(create)

    async def served_through_tls(fingerprint: str) -> None:
        # The apiserver learns of a configuration change through its informer: give the
        # new caBundle a moment to arrive, then expect our server's answer.
        messages: list[str] = []
        for _ in range(50):
            messages.append(await denial())
            if messages[-1].endswith(f"served {fingerprint}"):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"apiserver never got through: {messages[-3:]}")

    try:
        await asyncio.to_thread(
            registration.create_validating_webhook_configuration,
            k8s.V1ValidatingWebhookConfiguration(
                metadata=k8s.V1ObjectMeta(name=name), webhooks=[hook]
            ),
        )
        # Before injection the apiserver cannot verify our server.
        assert "failed calling webhook" in await denial()
        await asyncio.to_thread(inject)
        await served_through_tls(tls.loaded_fingerprint)

        old = tls.loaded_fingerprint
        rotate_ca(tmp_path)
        await asyncio.to_thread(inject)  # both CAs
        await served_through_tls(old)
        # Let the apiserver's informer deliver the two-CA bundle before we switch.
        await asyncio.sleep(2)
        new = renew_serving(tmp_path, "hw", "ns")
        await asyncio.sleep(0.2)
        assert tls.loaded_fingerprint == new.fingerprint
        assert (await denial()).endswith(f"served {new.fingerprint}")

        assert len(prune(tmp_path)) == 1
        await asyncio.to_thread(inject)
        await asyncio.sleep(2)
        assert (await denial()).endswith(f"served {new.fingerprint}")
        assert len(load_cert_dir(tmp_path).bundle) == 1
    finally:
        await asyncio.to_thread(registration.delete_validating_webhook_configuration, name)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await runner.cleanup()
