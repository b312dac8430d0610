"""The demo's stage, shared by its two stories (``demo.py``'s hold story and
``demo_lostnode.py``'s lost node): the narration, the enforcer as ``holdwarden serve`` with
its certificates, its webhook registration and caBundle injection, the readmission gate and
the audit trail's check of the real controllers' writes.

Its own module, below both stories: the hold story's ``holdwarden demo`` starts the
lost-node story, which uses this stage too, and neither imports the other for it
(``tests/unit/test_localcluster_imports.py`` keeps the package free of import circles).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from holdwarden.config import Config, ReadmissionConfig
from holdwarden.vocabulary import TRAINJOB, WORKLOAD
from rig.localcluster.cluster import LocalCluster
from rig.localcluster.ports import free_port
from rig.localcluster.rbac import GATE_IDENTITY
from rig.localcluster.realstory import (
    controller_refusals,
    make_admission_check,
    wait_until_enforced,
)

DEMO_LABEL = "holdwarden-demo"
WEBHOOK_CONFIG = "holdwarden-enforcer"
READMISSION_CHECK = "holdwarden-readmission"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show(label: str, value: Any) -> None:
    print(f"   {label}: {json.dumps(value, sort_keys=True)}", flush=True)


def holdwarden_cli(*args: str) -> list[str]:
    # The CLI is invoked as an operator would, through the installed entry point's module.
    return [sys.executable, "-m", "holdwarden.cli", *args]


@contextmanager
def enforcer(workdir: Path) -> Iterator[tuple[str, Path, Path]]:
    """Generate certificates and run ``holdwarden serve`` until the block ends."""
    cert_dir = workdir / "tls"
    subprocess.run(
        holdwarden_cli(
            "certs", "generate", "--service", "holdwarden-webhook",
            "--namespace", "holdwarden-system", "--ip", "127.0.0.1", "--out", str(cert_dir),
        ),
        check=True,
    )  # fmt: skip
    port, metrics_port = free_port(), free_port()
    audit_log = workdir / "audit.jsonl"
    config_path = workdir / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "webhook": {
                    "listenAddress": f"127.0.0.1:{port}",
                    "metricsAddress": f"127.0.0.1:{metrics_port}",
                    "certDir": str(cert_dir),
                    "auditLog": str(audit_log),
                }
            }
        )
    )
    log = (workdir / "serve.log").open("wb")
    server = subprocess.Popen(
        holdwarden_cli("serve", "--config", str(config_path)), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        for _ in range(100):
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=context, timeout=1
                ) as response:
                    if response.status == 200:
                        break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(
                        "holdwarden serve exited:\n" + (workdir / "serve.log").read_text()
                    ) from None
                time.sleep(0.1)
        else:
            raise RuntimeError("holdwarden serve did not become ready in 10s")
        yield f"https://127.0.0.1:{port}/validate", cert_dir / "ca.crt", audit_log
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def register_webhook(api: k8s.ApiClient, url: str) -> None:
    # A plain dict body: the client serialises it as is.
    rule = {
        "apiGroups": [TRAINJOB.group, WORKLOAD.group],
        "apiVersions": [TRAINJOB.version, WORKLOAD.version],
        "operations": ["CREATE", "UPDATE"],
        "resources": [TRAINJOB.plural, WORKLOAD.plural],
    }
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [
            {
                "name": "holds.holdwarden.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {"url": url},
                "rules": [rule],
                "namespaceSelector": {"matchLabels": {DEMO_LABEL: "true"}},
            }
        ],
    }
    k8s.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(body)


def inject(cluster: LocalCluster, ca_bundle: Path) -> None:
    """``holdwarden certs inject``: the CA bundle into the webhook configuration."""
    subprocess.run(
        holdwarden_cli(
            "certs", "inject", "--webhook-config", WEBHOOK_CONFIG,
            "--ca-bundle", str(ca_bundle), "--kubeconfig", str(cluster.kubeconfig_path),
        ),
        check=True,
    )  # fmt: skip


def wait_enforced(api: k8s.ApiClient, namespace: str) -> None:
    """Wait until the API server calls the enforcer for ``namespace``: it loads the
    webhook configuration and the injected caBundle a moment after they are written, and
    until then a TrainJob write would fail (failurePolicy Fail)."""
    wait_until_enforced(api, namespace)
    print(f"   the API server calls the enforcer in {namespace}: a dry-run canary is refused")


@contextmanager
def readmission_gate(cluster: LocalCluster) -> Iterator[str]:
    """The readmission gate and its AdmissionCheck (name yielded), as the gate's own
    service account. In a cluster ``holdwarden gate`` runs it (its own Deployment,
    manifests/readmission); here it runs in the demo's process, so that it can act as
    that identity."""
    from holdwarden.readmission.controller import ReadmissionGate

    config = Config(
        readmission=ReadmissionConfig(enabled=True, interval=timedelta(milliseconds=500))
    )
    with cluster.api_client() as admin:
        make_admission_check(admin, READMISSION_CHECK, config.readmission.controller_name)
    gate = ReadmissionGate(config, cluster.api_client(GATE_IDENTITY))
    gate.start()
    try:
        yield READMISSION_CHECK
    finally:
        gate.stop()


def controllers_unrefused(audit_log: Path) -> None:
    from holdwarden.webhook.audit import read_audit

    refused = controller_refusals(read_audit(audit_log).records)
    if refused:
        print(f"   !! the enforcer refused {len(refused)} writes of the real controllers")
    else:
        print("   the enforcer refused none of the real controllers' writes")
