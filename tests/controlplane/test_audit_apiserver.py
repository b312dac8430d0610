"""The apiserver's audit log, with the audit policy docs/explanation/audit-trail.md gives, is the
authoritative record of a refusal; holdwarden's own log also holds forged reviews.

A second local control plane runs with ``--audit-policy-file`` (the snippet copied from the
docs) and ``--audit-log-path``. A write refused through it shows up in the apiserver's log
with the authenticated user and our ``auditAnnotations`` prefixed with the webhook's name
(from the shipped manifest); a review POSTed straight to /validate shows up only in
holdwarden's log.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.config import Config, WebhookConfig
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations
from holdwarden.webhook.audit import read_audit
from rig.builders import trainjob_body
from rig.localcluster import EDITOR_USER, LocalCluster
from tests.support.enforcer_tls import run_in_thread
from tests.support.review_samples import review, trainjob

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
A = Annotations()
LABEL = "holdwarden.io/audit-e2e"
WAIT = 30.0  # seconds for the apiserver to use the webhook, or to write an event


def documented_policy() -> str:
    """The audit Policy YAML block of docs/explanation/audit-trail.md, exactly as a reader
    copies it."""
    text = (ROOT / "docs" / "explanation" / "audit-trail.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    policies = [b for b in blocks if "kind: Policy" in b]
    assert len(policies) == 1, "docs/explanation/audit-trail.md should give one audit Policy"
    return str(policies[0])


def shipped_webhook_name() -> str:
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "webhook.yaml").read_text()))
    config = next(d for d in docs if d and d.get("kind") == "ValidatingWebhookConfiguration")
    name: str = config["webhooks"][0]["name"]
    return name


class AuditedCluster(LocalCluster):
    """A local control plane whose kube-apiserver writes an audit log."""

    def __init__(self, policy: Path, log: Path) -> None:
        super().__init__()
        self.policy, self.log = policy, log

    def _spawn(
        self, name: str, command: list[str], *args: Any, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        if name == "kube-apiserver":
            command = [
                *command,
                f"--audit-policy-file={self.policy}",
                f"--audit-log-path={self.log}",
                "--audit-log-mode=blocking",  # the default; written before the answer
            ]
        return super()._spawn(name, command, *args, **kwargs)

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


def serve_in_thread(config: Config, tls: ReloadingTLS) -> tuple[EnforcerServer, Callable[[], None]]:
    server = EnforcerServer(config, tls=tls)
    return server, run_in_thread(server, "enforcer-audit-e2e")


def wait_for(predicate: Callable[[], Any], why: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(why)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("audit-e2e")
    (work / "policy.yaml").write_text(documented_policy())
    cluster = AuditedCluster(work / "policy.yaml", work / "apiserver-audit.jsonl")
    cluster.start()
    ca = generate_ca()
    leaf = generate_serving(ca, "holdwarden", "holdwarden-system", ip_addresses=["127.0.0.1"])
    (work / "tls.crt").write_bytes(leaf.cert_pem)
    (work / "tls.key").write_bytes(leaf.key_pem)
    (work / "ca.crt").write_bytes(ca.cert_pem)
    config = Config(
        webhook=WebhookConfig(
            listen_address="127.0.0.1:0",
            metrics_address="127.0.0.1:0",
            cert_dir=work,
            audit_log=work / "audit.jsonl",
        )
    )
    server, stop = serve_in_thread(config, ReloadingTLS(work / "tls.crt", work / "tls.key"))
    token = uuid.uuid4().hex[:10]
    webhook_name = shipped_webhook_name()
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"holdwarden-audit-e2e-{token}"},
        "webhooks": [
            {
                "name": webhook_name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.port}/validate",
                    "caBundle": base64.b64encode(ca.cert_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [TRAINJOB.group, WORKLOAD.group],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [TRAINJOB.plural, WORKLOAD.plural],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {LABEL: token}},
            }
        ],
    }
    try:
        with cluster.api_client() as admin:
            k8s.AdmissionregistrationV1Api(admin).create_validating_webhook_configuration(body)
        namespace = cluster.create_namespace(f"audit-{token}", labels={LABEL: token})
        yield {
            "cluster": cluster,
            "server": server,
            "namespace": namespace,
            "webhook": webhook_name,
            "audit_log": work / "audit.jsonl",
            "ca": work / "ca.crt",
        }
    finally:
        stop()
        cluster.stop()


def held_running(name: str, instance: str) -> dict[str, Any]:
    body = trainjob_body(name, suspend=False)
    body["metadata"]["annotations"] = {A.hold_instance: instance}
    return body


def refusal_as(cluster: LocalCluster, user: str, namespace: str, body: dict[str, Any]) -> str:
    """Create ``body`` as ``user``; the refusal's body ("" if it was allowed)."""
    with cluster.api_client(user) as api:
        try:
            k8s.CustomObjectsApi(api).create_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
            )
        except ApiException as exc:
            return str(exc.body or exc.reason or exc.status)
    return ""


def test_refusal_is_in_the_apiserver_audit_log_with_our_annotations(
    audited: dict[str, Any],
) -> None:
    cluster: AuditedCluster = audited["cluster"]
    namespace, prefix = audited["namespace"], audited["webhook"]
    # The apiserver takes a moment to start calling a new webhook; until it does, the
    # held-running TrainJob would be created, so each try uses a fresh name.
    names: list[str] = []

    def refused() -> str | None:
        name = f"held-run-{len(names)}"
        names.append(name)
        # Only the enforcer's refusal counts: not an RBAC 403 or a failed webhook call.
        refusal = refusal_as(cluster, EDITOR_USER, namespace, held_running(name, "7"))
        return name if "held-trainjob-suspended" in refusal else None

    name = wait_for(refused, "the apiserver never called the enforcer")

    def event() -> dict[str, Any] | None:
        for entry in cluster.events():
            ref = entry.get("objectRef", {})
            if ref.get("name") == name and entry.get("stage") == "ResponseComplete":
                return entry
        return None

    entry = wait_for(event, f"no apiserver audit event for {namespace}/{name}")
    # Authenticated by the apiserver, not taken from a review body: the test client is the
    # admin impersonating alice, and the event says both.
    assert entry["user"]["username"] == "holdwarden-admin"
    assert entry["impersonatedUser"]["username"] == EDITOR_USER
    assert entry["verb"] == "create" and entry["objectRef"]["namespace"] == namespace
    assert entry["responseStatus"]["code"] == 403
    assert entry["annotations"][f"{prefix}/rule"] == "held-trainjob-suspended"
    assert entry["annotations"][f"{prefix}/instance"] == "7"
    assert f"{prefix}/dryRun" not in entry["annotations"]
    # holdwarden's own line names the same object, rule and instance.
    ours = [r for r in read_audit(audited["audit_log"]).records if r["name"] == name]
    assert len(ours) == 1 and ours[0]["user"] == EDITOR_USER
    assert (ours[0]["rule"], ours[0]["instance"]) == ("held-trainjob-suspended", "7")


def test_dry_run_refusal_is_annotated(audited: dict[str, Any]) -> None:
    cluster: AuditedCluster = audited["cluster"]
    namespace, prefix = audited["namespace"], audited["webhook"]
    name = f"dry-{uuid.uuid4().hex[:6]}"
    with cluster.api_client(EDITOR_USER) as api:

        def refused() -> bool:
            try:
                k8s.CustomObjectsApi(api).create_namespaced_custom_object(
                    TRAINJOB.group,
                    TRAINJOB.version,
                    namespace,
                    TRAINJOB.plural,
                    held_running(name, "3"),
                    dry_run="All",
                )
            except ApiException as exc:
                return bool(exc.status == 403)
            return False

        wait_for(refused, "the dry-run write was not refused")

    def event() -> dict[str, Any] | None:
        for entry in cluster.events():
            annotations = entry.get("annotations", {})
            if entry.get("objectRef", {}).get("name") == name and f"{prefix}/rule" in annotations:
                return entry
        return None

    entry = wait_for(event, "no annotated apiserver event for the dry run")
    assert entry["annotations"][f"{prefix}/dryRun"] == "true"


def test_a_forged_review_is_only_in_holdwardens_log(audited: dict[str, Any]) -> None:
    cluster: AuditedCluster = audited["cluster"]
    server: EnforcerServer = audited["server"]
    forged_name = f"forged-{uuid.uuid4().hex[:6]}"
    kueue = "system:serviceaccount:kueue-system:kueue-controller-manager"
    forged = review(
        old=trainjob(suspend=True, instance="9", name=forged_name),
        new=trainjob(suspend=False, instance="9", name=forged_name),
        user=kueue,
        namespace=audited["namespace"],
        name=forged_name,
    )
    context = ssl.create_default_context(cafile=str(audited["ca"]))
    request = urllib.request.Request(
        f"https://127.0.0.1:{server.port}/validate",
        data=json.dumps(forged).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        assert json.loads(answer.read())["response"]["allowed"] is False
    ours = [r for r in read_audit(audited["audit_log"]).records if r["name"] == forged_name]
    assert len(ours) == 1 and ours[0]["user"] == kueue  # attributed as the forger wrote it
    # Give the apiserver's log time to have had it, if it could have; it cannot.
    time.sleep(1)
    assert not [e for e in cluster.events() if e.get("objectRef", {}).get("name") == forged_name]
