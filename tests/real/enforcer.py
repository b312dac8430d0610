"""The enforcer and the readmission gate, registered in the real-controller cluster.

The enforcer runs in this process (its own thread and event loop, TLS on 127.0.0.1) and is
registered with the shipped matchConditions, for the namespaces carrying this run's label
only. The gate is the project's real ReadmissionGate, as the enforcer's identity.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.config import Config, KueueConfig, ReadmissionConfig, WebhookConfig
from holdwarden.labelselector import LabelSelector
from holdwarden.readmission.controller import ReadmissionGate
from holdwarden.webhook.audit import read_audit
from holdwarden.webhook.match_conditions import kueue_namespace_webhook
from rig.localcluster import GATE_IDENTITY, LocalCluster
from rig.localcluster.realstory import make_admission_check, wait_until_enforced
from tests.support.shipped_webhook import shipped_match_conditions, shipped_rules

ENFORCED_LABEL = "holdwarden.io/real-e2e"
ENFORCER_WEBHOOK = "holds.holdwarden.io"
"""The enforcer's webhook name in these tests: a controller's log names it in a denial."""


@dataclass
class Enforcement:
    """A running enforcer: its audit log, and the label that puts a namespace under it."""

    audit_log: Path
    token: str
    check_name: str

    def labels(self) -> dict[str, str]:
        return {ENFORCED_LABEL: self.token}

    def audit(self) -> list[dict[str, Any]]:
        return list(read_audit(self.audit_log).records)


@contextmanager
def _enforcer_thread(config: Config, tls: ReloadingTLS) -> Iterator[EnforcerServer]:
    loop = asyncio.new_event_loop()
    server = EnforcerServer(config, tls=tls)
    started = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:  # re-raised below, in the test's thread
            failure.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="real-enforcer", daemon=True)
    thread.start()
    if not started.wait(30):
        raise AssertionError("the enforcer did not start within 30s")
    if failure:
        raise failure[0]
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@contextmanager
def enforcement(
    cluster: LocalCluster, work: Path, *, queueless: LabelSelector | None = None
) -> Iterator[Enforcement]:
    """The enforcer registered in the apiserver, and the readmission gate running.

    ``queueless``: Kueue manages jobs without a queue name in the namespaces this selector (its
    managedJobsNamespaceSelector) selects; the enforcer is configured so, and its second webhook
    entry is registered too (holdwarden.webhook.match_conditions.kueue_namespace_webhook, confined
    like the first to this run's namespaces)."""
    ca = generate_ca()
    leaf = generate_serving(ca, "holdwarden", "holdwarden-system", ip_addresses=["127.0.0.1"])
    (work / "tls.crt").write_bytes(leaf.cert_pem)
    (work / "tls.key").write_bytes(leaf.key_pem)
    token = uuid.uuid4().hex[:12]
    check_name = f"readmission-{token}"
    config = Config(
        kueue=KueueConfig(
            manage_jobs_without_queue_name=queueless is not None,
            managed_jobs_namespace_selector=queueless or LabelSelector(),
        ),
        webhook=WebhookConfig(
            listen_address="127.0.0.1:0",
            metrics_address="127.0.0.1:0",
            cert_dir=work,
            audit_log=work / "audit.jsonl",
        ),
        readmission=ReadmissionConfig(
            enabled=True,
            controller_name=f"holdwarden.io/{check_name}",
            interval=timedelta(milliseconds=200),
        ),
    )
    with cluster.api_client() as admin:
        make_admission_check(admin, check_name, f"holdwarden.io/{check_name}")
        gate = ReadmissionGate(config, cluster.api_client(GATE_IDENTITY))
        gate.start()
        try:
            with _enforcer_thread(
                config, ReloadingTLS(work / "tls.crt", work / "tls.key")
            ) as server:
                name = f"holdwarden-real-{token}"
                body: Any = {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": name},
                    "webhooks": [
                        {
                            "name": ENFORCER_WEBHOOK,
                            "admissionReviewVersions": ["v1"],
                            "sideEffects": "None",
                            "failurePolicy": "Fail",
                            "timeoutSeconds": 5,
                            "clientConfig": {
                                "url": f"https://127.0.0.1:{server.port}/validate",
                                "caBundle": base64.b64encode(ca.cert_pem).decode(),
                            },
                            # As shipped: DELETE of a held Workload is judged too, so
                            # the garbage collector's deletes meet the enforcer here.
                            "rules": shipped_rules(),
                            "namespaceSelector": {"matchLabels": {ENFORCED_LABEL: token}},
                            "matchConditions": shipped_match_conditions(),
                        }
                    ],
                }
                if queueless is not None:
                    first = body["webhooks"][0]
                    second = kueue_namespace_webhook(
                        first["clientConfig"], queueless, failure_policy="Fail"
                    )
                    # Confined to this run's namespaces, on top of Kueue's selector.
                    second["namespaceSelector"].setdefault("matchLabels", {})[ENFORCED_LABEL] = (
                        token
                    )
                    body["webhooks"].append(second)
                registrations = k8s.AdmissionregistrationV1Api(admin)
                registrations.create_validating_webhook_configuration(body)
                try:
                    probe_ns = cluster.create_namespace(
                        f"probe-{token}", labels={ENFORCED_LABEL: token}
                    )
                    wait_until_enforced(admin, probe_ns)
                    yield Enforcement(work / "audit.jsonl", token, check_name)
                finally:
                    registrations.delete_validating_webhook_configuration(name)
        finally:
            gate.stop()
        if gate.errors:
            raise AssertionError(f"the readmission gate met {gate.errors} errors")
