"""Kueue's manageJobsWithoutQueueName in admission, on the real kube-apiserver.

The enforcer is registered with both webhook entries (the second one's namespaceSelector
is Kueue's managedJobsNamespaceSelector, evaluated by the apiserver itself), and then,
instead, the policy twin with its second policy and binding. The same writes go to both:
spec.suspend flips and plain annotation changes of TrainJobs with and without the queue
label, by a person and by Kueue, in a namespace the selector selects and in one it does
not. Both twins must give the same verdicts, with the same words, and those verdicts must
be the table below. A write refused is a dry run, so every case starts from the same
objects.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.config import Config, KueueConfig, WebhookConfig
from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, RuleId
from holdwarden.webhook.audit import read_audit
from holdwarden.webhook.match_conditions import kueue_namespace_selector, kueue_namespace_webhook
from holdwarden.webhook.policy import binding, render_kueue_namespace_policy, render_rules_policy
from rig.builders import trainjob_body
from rig.localcluster import EDITOR_USER, KUEUE_IDENTITY, LocalCluster
from rig.localcluster.realstory import NotWithin, eventually
from tests.controlplane.test_webhook_e2e import _serve_in_thread
from tests.support.shipped_webhook import local_registration, local_webhook

pytestmark = pytest.mark.controlplane

LABEL = "holdwarden.io/queueless-admission"
TEAM = "example.com/team"
SELECTOR = LabelSelector(match_labels=((TEAM, "ml"),))
KUEUE_OWNS = str(RuleId.KUEUE_OWNS_SUSPEND)

# (namespace selected, TrainJob labelled, writer, write) -> expected verdict.
FLIP = {"spec": {"suspend": False}}
ANNOTATE = {"metadata": {"annotations": {"example.com/note": "x"}}}
CASES: list[tuple[bool, bool, str, str, str]] = [
    (selected, labelled, user, write, verdict)
    for selected, labelled, user, write, verdict in [
        (True, False, EDITOR_USER, "flip", KUEUE_OWNS),  # Kueue's by its namespace
        (True, True, EDITOR_USER, "flip", KUEUE_OWNS),  # Kueue's by its label
        (False, True, EDITOR_USER, "flip", KUEUE_OWNS),
        (False, False, EDITOR_USER, "flip", "allowed"),  # not Kueue's here
        (True, False, KUEUE_IDENTITY, "flip", "allowed"),  # Kueue itself
        (True, True, KUEUE_IDENTITY, "flip", "allowed"),
        (True, False, EDITOR_USER, "annotate", "allowed"),  # spec.suspend unchanged
        (False, False, EDITOR_USER, "annotate", "allowed"),
    ]
]


def _verdict(exc: ApiException | None) -> tuple[str, str]:
    """('allowed', '') or (rule id, the refusal's words from the rule id on)."""
    if exc is None:
        return "allowed", ""
    message = str(json.loads(exc.body or "{}").get("message", exc.body))
    at = message.find(f"[{KUEUE_OWNS}]:")
    if exc.status != 403 or at < 0:
        return f"error {exc.status}", message[:300]
    return KUEUE_OWNS, message[at:]


def _write(api: k8s.ApiClient, namespace: str, name: str, write: str) -> tuple[str, str]:
    try:
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, name,
            FLIP if write == "flip" else ANNOTATE, dry_run="All",
        )  # fmt: skip
    except ApiException as exc:
        return _verdict(exc)
    return _verdict(None)


@pytest.fixture(scope="module")
def world(cluster: LocalCluster) -> Iterator[tuple[str, dict[bool, str]]]:
    """A token, and a namespace per 'selected' with a labelled and an unlabelled TrainJob,
    both suspended (as Kueue leaves a job it has not admitted)."""
    token = uuid.uuid4().hex[:10]
    namespaces: dict[bool, str] = {}
    with cluster.api_client() as admin:
        for selected in (True, False):
            labels = {LABEL: token} | ({TEAM: "ml"} if selected else {})
            namespace = cluster.create_namespace(
                f"qla-{'sel' if selected else 'not'}-{token}", labels=labels
            )
            namespaces[selected] = namespace
            for name, queue in (("bare", None), ("labelled", "lq")):
                k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
                    TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
                    trainjob_body(name, queue=queue, suspend=True),
                )  # fmt: skip
    yield token, namespaces


def _run_cases(cluster: LocalCluster, namespaces: dict[bool, str]) -> list[tuple[str, str]]:
    found = []
    for selected, labelled, user, write, _ in CASES:
        with cluster.api_client(user) as api:
            name = "labelled" if labelled else "bare"
            found.append(_write(api, namespaces[selected], name, write))
    return found


def _until(probe: Callable[[], bool], what: str) -> None:
    try:
        eventually(probe, what, timeout=60)
    except NotWithin as exc:
        raise NotWithin(f"{exc}; last seen {LAST_SEEN}") from None


LAST_SEEN: list[object] = []


def _both_entries_in_force(cluster: LocalCluster, namespaces: dict[bool, str]) -> bool:
    # Each entry (or policy) is loaded on its own: both refusals must be seen.
    with cluster.api_client(EDITOR_USER) as alice:
        by_label = _write(alice, namespaces[False], "labelled", "flip")
        by_namespace = _write(alice, namespaces[True], "bare", "flip")
    LAST_SEEN[:] = [by_label, by_namespace]
    return by_label[0] == by_namespace[0] == KUEUE_OWNS


def _none_in_force(cluster: LocalCluster, namespaces: dict[bool, str]) -> bool:
    with cluster.api_client(EDITOR_USER) as alice:
        return all(
            _write(alice, namespaces[s], n, "flip")[0] == "allowed"
            for s, n in ((False, "labelled"), (True, "bare"))
        )


@contextmanager
def _webhook(cluster: LocalCluster, token: str, work: Path) -> Iterator[Path]:
    ca = generate_ca()
    leaf = generate_serving(ca, "holdwarden", "holdwarden-system", ip_addresses=["127.0.0.1"])
    (work / "tls.crt").write_bytes(leaf.cert_pem)
    (work / "tls.key").write_bytes(leaf.key_pem)
    config = Config(
        kueue=KueueConfig(
            manage_jobs_without_queue_name=True,
            managed_jobs_namespace_selector=SELECTOR,
        ),
        webhook=WebhookConfig(
            listen_address="127.0.0.1:0",
            metrics_address="127.0.0.1:0",
            cert_dir=work,
            audit_log=work / "audit.jsonl",
        ),
    )
    server, stop = _serve_in_thread(config, ReloadingTLS(work / "tls.crt", work / "tls.key"))
    first = local_webhook(server.port, {LABEL: token}, ca_pem=ca.cert_pem)
    second = kueue_namespace_webhook(first["clientConfig"], SELECTOR, failure_policy="Fail")
    second["namespaceSelector"].setdefault("matchLabels", {})[LABEL] = token
    assert second["clientConfig"]["url"].endswith("/validate/kueue-managed-namespace")
    assert second["clientConfig"]["caBundle"] == base64.b64encode(ca.cert_pem).decode()
    name = f"holdwarden-queueless-{token}"
    with cluster.api_client() as admin:
        registrations = k8s.AdmissionregistrationV1Api(admin)
        registration: Any = local_registration(name, first, second)
        registrations.create_validating_webhook_configuration(registration)
        try:
            yield work / "audit.jsonl"
        finally:
            registrations.delete_validating_webhook_configuration(name)
            stop()


def _confined(selector: dict[str, Any], token: str) -> dict[str, Any]:
    """``selector`` ANDed with this test's namespace label."""
    return {**selector, "matchLabels": {**selector.get("matchLabels", {}), LABEL: token}}


@contextmanager
def _policies(cluster: LocalCluster, token: str) -> Iterator[None]:
    rules_name, queueless_name = f"hw-rules-{token}", f"hw-queueless-{token}"
    documents: list[Any] = [
        render_rules_policy(name=rules_name),
        binding(rules_name, {"matchLabels": {LABEL: token}}),
        render_kueue_namespace_policy(name=queueless_name),
        binding(queueless_name, _confined(kueue_namespace_selector(SELECTOR), token)),
    ]
    with cluster.api_client() as admin:
        api = k8s.AdmissionregistrationV1Api(admin)
        for doc in documents:
            if doc["kind"] == "ValidatingAdmissionPolicy":
                api.create_validating_admission_policy(doc)
            else:
                api.create_validating_admission_policy_binding(doc)
        try:
            yield
        finally:
            for name in (rules_name, queueless_name):
                api.delete_validating_admission_policy_binding(name)
                api.delete_validating_admission_policy(name)


def test_both_twins_refuse_exactly_kueues_suspend_changes_in_kueues_namespaces(
    cluster: LocalCluster, world: tuple[str, dict[bool, str]], tmp_path: Path
) -> None:
    token, namespaces = world
    with _webhook(cluster, token, tmp_path) as audit_log:
        _until(lambda: _both_entries_in_force(cluster, namespaces), "both webhook entries")
        before = len(list(read_audit(audit_log).records))
        by_webhook = _run_cases(cluster, namespaces)
        records = list(read_audit(audit_log).records)[before:]
    _until(lambda: _none_in_force(cluster, namespaces), "the webhook's removal")
    with _policies(cluster, token):
        _until(lambda: _both_entries_in_force(cluster, namespaces), "both policies")
        by_policy = _run_cases(cluster, namespaces)
    _until(lambda: _none_in_force(cluster, namespaces), "the policies' removal")

    expected = [case[4] for case in CASES]
    assert [v for v, _ in by_webhook] == expected
    assert by_policy == by_webhook  # the same verdicts, in the same words
    # The namespace is named where it, not the label, makes the TrainJob Kueue's.
    queueless = by_webhook[0][1]
    assert f"namespace '{namespaces[True]}' is one Kueue's managedJobsNamespaceSelector" in (
        queueless
    )
    assert f"label {QUEUE_NAME_LABEL}" in by_webhook[1][1]
    # Each refused write was audited once: the second entry judges only what the first
    # cannot (nothing refused twice).
    assert [r["rule"] for r in records] == [v for v in expected if v != "allowed"]
    assert all(r["dryRun"] for r in records)
