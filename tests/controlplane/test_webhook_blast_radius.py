"""Blast radius: which writes the shipped webhook configuration sends to the enforcer.

With ``failurePolicy: Fail`` every write the apiserver sends is refused while no enforcer
replica answers. The shipped ``matchConditions`` and ``namespaceSelector``
(manifests/webhook.yaml, rendered by webhook/match_conditions.py) keep that set to the
writes that could break a hold. Proven here against the real kube-apiserver, with the
conditions read from the manifest file itself:

- ``test_blast_radius_with_the_enforcer_down``: the shipped webhook registered with
  ``failurePolicy: Fail`` and pointing at a closed port. A table of write kinds, each
  judged by the pure rules (what a running enforcer would answer) and then sent with the
  enforcer down. Writes to objects with no hold that the rules allow all pass; every
  write the rules refuse is still refused. The table is in docs/explanation/blast-radius.md,
  and the test
  fails if the two differ.
- ``test_every_refused_write_reaches_the_webhook``: a Hypothesis property. A counting
  webhook (allows everything) registered with the shipped conditions; generated writes
  are sent as dry runs; every write the pure rules refuse was delivered to it, and the
  apiserver delivers exactly what the documented conditions say.

Each registration is confined to namespaces carrying this module's own label with a
random value (ANDed with the shipped selector), so no other test is affected.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import itertools
import json
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.config import Config
from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations, Resource
from holdwarden.webhook.match_conditions import overlay_patch, render, same_expression
from holdwarden.webhook.rules import Change, RulesConfig, evaluate, skip_reason
from rig.builders import trainjob_body, workload_body
from rig.localcluster import (
    EDITOR_USER,
    GATE_IDENTITY,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    TRAINER_IDENTITY,
    LocalCluster,
)
from tests.support.shipped_webhook import (
    WEBHOOK_MANIFEST,
    shipped_match_conditions,
    shipped_namespace_selector,
    shipped_webhook,
)

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BLAST_RADIUS_DOC = ROOT / "docs" / "explanation" / "blast-radius.md"
LABEL = "holdwarden.io/blast-radius"
OWN_NAMESPACE = "holdwarden-system"
REQUEST_TIMEOUT = 20  # seconds, for every API call: nothing here may hang


def _shipped_config() -> Config:
    """The configuration the manifests ship (the ConfigMap), which the rules judge with."""
    return Config.from_dict(yaml.safe_load((MANIFESTS / "config" / "config.yaml").read_text()))


CONFIG = _shipped_config()
RULES = RulesConfig.from_config(CONFIG)
A = Annotations(CONFIG.annotation_prefix)


def _rule_configs() -> list[RulesConfig]:
    """The shipped rules, and, where the rules have it, the optional ``hold-owner-only`` on
    (holder: the supervisor): the conditions must send what that rule refuses too."""
    configs = [RULES]
    if "holder_identities" in {f.name for f in dataclasses.fields(RulesConfig)}:
        # By name: the field is newer than this test's first version of the rules.
        holders: dict[str, Any] = {"holder_identities": frozenset({SUPERVISOR_IDENTITY})}
        configs.append(dataclasses.replace(RULES, **holders))
    return configs


def _refused(change: Change) -> bool:
    """Whether the pure rules refuse ``change`` under any of the rule configurations."""
    return any(evaluate(change, config) is not None for config in _rule_configs())


# --- the manifest agrees with the configuration (no control plane) ------------------------


def test_shipped_conditions_are_rendered_for_the_shipped_configuration() -> None:
    """The expression in webhook.yaml is render() of the ConfigMap's prefix and identities:
    a change to either that forgets the webhook fails here."""
    (condition,) = shipped_match_conditions()
    expected = render(CONFIG.annotation_prefix, CONFIG.kueue_identities)
    assert same_expression(condition["expression"], expected), condition["expression"]


def test_shipped_namespace_selector_excludes_kube_system_and_our_namespace() -> None:
    hook = shipped_webhook()
    assert hook["failurePolicy"] == "Fail"
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", OWN_NAMESPACE],
            }
        ]
    }
    assert hook["clientConfig"]["service"]["namespace"] == OWN_NAMESPACE
    assert "objectSelector" not in hook  # labels are the writer's to change: no escape hatch


def test_overlay_patch_replaces_the_shipped_expression() -> None:
    """The patch `python -m holdwarden.webhook.match_conditions` prints applies at the path it
    names."""
    ops = yaml.safe_load(overlay_patch("example.com", ["kueue-writers"]))
    (op,) = ops
    assert op["op"] == "replace"
    document = yaml.safe_load(WEBHOOK_MANIFEST.read_text())
    # Walk the JSON pointer /webhooks/0/matchConditions/0/expression.
    parts = op["path"].strip("/").split("/")
    target: Any = document
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    assert parts[-1] in target
    target[parts[-1]] = op["value"]
    expression = document["webhooks"][0]["matchConditions"][0]["expression"]
    assert '"example.com/" + k' in expression and "holdwarden.io" not in expression
    assert '["kueue-writers"]' in expression


def test_network_policy_admits_the_webhook_port_and_metrics_from_monitoring() -> None:
    (policy,) = yaml.safe_load_all((MANIFESTS / "networkpolicy.yaml").read_text())
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    admission, metrics = policy["spec"]["ingress"]
    # The apiserver is not a Pod any selector could name: admission is open to all sources.
    assert "from" not in admission
    assert admission["ports"] == [{"port": ports["https"], "protocol": "TCP"}]
    assert metrics["ports"] == [{"port": ports["metrics"], "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


# --- identities and writes ------------------------------------------------------------------


def _service_account_groups(namespace: str) -> tuple[str, ...]:
    # What the apiserver adds when a service-account user name is impersonated.
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")


@dataclass(frozen=True)
class Writer:
    label: str
    username: str
    groups: tuple[str, ...]

    @property
    def is_kueue(self) -> bool:
        ids = set(CONFIG.kueue_identities)
        return self.username in ids or any(group in ids for group in self.groups)


ALICE = Writer("alice (editor)", EDITOR_USER, ("system:authenticated",))
KUEUE = Writer("Kueue", KUEUE_IDENTITY, _service_account_groups("kueue-system"))
TRAINER = Writer("Trainer", TRAINER_IDENTITY, _service_account_groups("kubeflow-system"))
SUPERVISOR = Writer("supervisor", SUPERVISOR_IDENTITY, _service_account_groups(OWN_NAMESPACE))
GATE = Writer("readmission gate", GATE_IDENTITY, _service_account_groups(OWN_NAMESPACE))


def _coords(kind: str) -> Resource:
    return TRAINJOB if kind == TRAINJOB.kind else WORKLOAD


def _get(api: k8s.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any]:
    coords = _coords(kind)
    got: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        coords.group, coords.version, namespace, coords.plural, name,
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    return dict(got)


def _create(api: k8s.ApiClient, namespace: str, body: dict[str, Any], *, dry: bool) -> Any:
    coords = _coords(body["kind"])
    extra: dict[str, Any] = {"dry_run": "All"} if dry else {}
    return k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        coords.group, coords.version, namespace, coords.plural, body,
        _request_timeout=REQUEST_TIMEOUT, **extra,
    )  # fmt: skip


@dataclass(frozen=True)
class Write:
    """One row of the table: a dry-run write, by whom, and whether the shipped conditions
    are meant to send it to the enforcer."""

    what: str
    writer: Writer
    kind: str
    namespace: str
    name: str
    operation: str  # CREATE, UPDATE (a JSON merge patch) or DELETE
    body: Any = None
    status: bool = False  # the status sub-resource
    sent: bool = False
    put: bool = False  # an UPDATE (read, change, PUT) for writers allowed update, not patch

    def run(self, api: k8s.ApiClient) -> Any:
        """Send it as a server-side dry run (nothing is stored); return the result."""
        coords = _coords(self.kind)
        custom = k8s.CustomObjectsApi(api)
        common: dict[str, Any] = {"dry_run": "All", "_request_timeout": REQUEST_TIMEOUT}
        args = (coords.group, coords.version, self.namespace, coords.plural)
        if self.operation == "CREATE":
            return custom.create_namespaced_custom_object(*args, self.body, **common)
        if self.operation == "DELETE":
            return custom.delete_namespaced_custom_object(*args, self.name, **common)
        if self.put:
            current = _get(api, self.kind, self.namespace, self.name)
            return custom.replace_namespaced_custom_object(
                *args, self.name, _merge(current, self.body), **common
            )
        method = (
            custom.patch_namespaced_custom_object_status
            if self.status
            else custom.patch_namespaced_custom_object
        )
        return method(
            *args, self.name, self.body, _content_type="application/merge-patch+json", **common
        )


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what the apiserver does with a merge-patch body."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


@dataclass
class Outcome:
    write: Write
    hold_on_object: bool
    verdict: str  # what the pure rules (a running enforcer) answer
    rules_refuse: bool
    refused_down: bool = False
    message: str = ""


def _has_hold(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return any(key in annotations for key in A.hold_keys)


def _judge(write: Write, old: dict[str, Any] | None, new: Any) -> tuple[str, bool]:
    """What the pure rules answer for this write, given the stored and resulting objects."""
    change = Change(
        group=_coords(write.kind).group,
        resource=_coords(write.kind).plural,
        subresource="status" if write.status else "",
        operation=write.operation,
        namespace=write.namespace,
        name=write.name,
        username=write.writer.username,
        groups=write.writer.groups,
        old=old if write.operation != "CREATE" else None,
        new=new if write.operation != "DELETE" else None,
    )
    if write.status:
        return "not judged (status)", False
    if write.operation == "DELETE" and write.kind == TRAINJOB.kind:
        return "not judged (DELETE)", False
    assert skip_reason(change) is None, skip_reason(change)
    violation = evaluate(change, RULES)
    return (f"refuse: `{violation.rule}`", True) if violation else ("allow", False)


# --- a webhook that is down ------------------------------------------------------------------


@dataclass
class Registration:
    name: str
    webhook: str
    token: str
    cluster: LocalCluster
    namespaces: list[str] = field(default_factory=list)

    def label(self, namespace: str) -> None:
        """Put ``namespace`` under this registration (the shipped selector still applies)."""
        with self.cluster.api_client() as admin:
            k8s.CoreV1Api(admin).patch_namespace(
                namespace, {"metadata": {"labels": {LABEL: self.token}}},
                _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        self.namespaces.append(namespace)


@contextlib.contextmanager
def registered(
    cluster: LocalCluster,
    client_config: dict[str, Any],
    purpose: str,
    match_conditions: list[dict[str, str]] | None = None,
) -> Iterator[Registration]:
    """The shipped webhook (rules, failurePolicy, timeout, matchConditions, namespaceSelector)
    registered with ``client_config`` and confined to namespaces labelled with a new token.

    ``match_conditions`` replaces the shipped ones (an overlay's), when given.
    """
    token = uuid.uuid4().hex[:12]
    hook = shipped_webhook()
    hook["clientConfig"] = client_config
    if match_conditions is not None:
        hook["matchConditions"] = match_conditions
    hook["namespaceSelector"] = shipped_namespace_selector({LABEL: token})
    name = f"holdwarden-{purpose}-{token}"
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook],
    }
    with cluster.api_client() as admin:
        registrations = k8s.AdmissionregistrationV1Api(admin)
        registrations.create_validating_webhook_configuration(
            body, _request_timeout=REQUEST_TIMEOUT
        )
        registration = Registration(name, hook["name"], token, cluster)
        try:
            yield registration
        finally:
            registrations.delete_validating_webhook_configuration(
                name, _request_timeout=REQUEST_TIMEOUT
            )
            core = k8s.CoreV1Api(admin)
            for namespace in registration.namespaces:  # kube-system among them
                core.patch_namespace(
                    namespace, {"metadata": {"labels": {LABEL: None}}},
                    _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port nothing listens on, reserved for as long as the block runs: a socket bound
    without listen() makes the kernel refuse every connection to it at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def _held_running_probe() -> dict[str, Any]:
    probe = trainjob_body(f"probe-{uuid.uuid4().hex[:6]}", suspend=False)
    probe["metadata"]["annotations"] = {A.hold_instance: "1"}
    return probe


def _failed_call(exc: ApiException, registration: Registration) -> bool:
    """The apiserver's refusal when it could not call the webhook (failurePolicy Fail)."""
    if exc.status != 500:
        return False
    message = str(json.loads(exc.body or "{}").get("message", ""))
    return f'failed calling webhook "{registration.webhook}"' in message


def _wait_until_refused(admin: k8s.ApiClient, registration: Registration, namespace: str) -> None:
    """The apiserver sees a new configuration and namespace labels a moment later."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _create(admin, namespace, _held_running_probe(), dry=True)
        except ApiException as exc:
            if _failed_call(exc, registration):
                return
            raise
        time.sleep(0.2)
    raise AssertionError("the apiserver never applied the registration")


def _ensure_namespace(admin: k8s.ApiClient, name: str) -> None:
    try:
        k8s.CoreV1Api(admin).create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)),
            _request_timeout=REQUEST_TIMEOUT,
        )
    except ApiException as exc:
        if exc.status != 409:  # another test made it: fine
            raise


def _hold(instance: str) -> dict[str, str]:
    return {
        A.hold_instance: instance,
        A.hold_reason: "node lost",
        A.held_at: "2026-12-02T12:00:00Z",
        A.held_by: "dispatch",
    }


def _condition(kind: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True",
        "reason": kind,
        "message": "test",
        "lastTransitionTime": "2026-12-02T12:00:00Z",
    }


def _objects(admin: k8s.ApiClient, ns: str, suffix: str) -> dict[str, dict[str, Any]]:
    """The stored objects the table writes to (dry runs leave them as they are)."""

    def make(namespace: str, body: dict[str, Any], *, annotations: dict[str, str] | None = None,
             finalizers: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
        if annotations:
            body["metadata"]["annotations"] = annotations
        if finalizers:
            body["metadata"]["finalizers"] = finalizers
        return dict(_create(admin, namespace, body, dry=False))

    objects: dict[str, dict[str, Any]] = {}
    objects["plain"] = make(ns, trainjob_body("plain", suspend=False))
    objects["queued"] = make(ns, trainjob_body("queued", queue="user-queue", suspend=True))
    objects["admitted"] = make(ns, trainjob_body("admitted", queue="user-queue", suspend=False))
    objects["opened"] = make(
        ns, trainjob_body("opened", queue="user-queue", suspend=True),
        annotations={A.opened: "2026-12-02T12:00:00Z", A.attempt: "1"},
    )  # fmt: skip
    objects["held"] = make(ns, trainjob_body("held", suspend=True), annotations=_hold("3"))
    in_use = ["kueue.x-k8s.io/resource-in-use"]
    objects["wl"] = make(ns, workload_body("wl", trainjob=objects["queued"]), finalizers=in_use)
    objects["wl-off"] = make(ns, workload_body("wl-off", trainjob=objects["queued"], active=False))
    objects["wl-held"] = make(
        ns, workload_body("wl-held", trainjob=objects["opened"], active=False),
        annotations=_hold("2"), finalizers=in_use,
    )  # fmt: skip
    for namespace in ("kube-system", OWN_NAMESPACE):
        objects[namespace] = make(
            namespace, trainjob_body(f"held-{suffix}", suspend=True), annotations=_hold("1")
        )
    return objects


def _table_writes(ns: str, objects: dict[str, dict[str, Any]]) -> list[Write]:
    """The write kinds of the table, in its order. ``sent`` is what the shipped conditions
    are meant to do; the test checks it and, independently, what the rules say."""
    tj, wl = TRAINJOB.kind, WORKLOAD.kind
    held_running = trainjob_body("new-held", suspend=False)
    held_running["metadata"]["annotations"] = _hold("1")
    held_active = workload_body("new-held-wl", active=True)
    held_active["metadata"]["annotations"] = _hold("1")
    drop_hold = {key: None for key in A.hold_keys}

    def name(key: str) -> str:
        return str(objects[key]["metadata"]["name"])

    return [
        # -- objects with no hold
        Write("create a running TrainJob (no queue)", ALICE, tj, ns, "new-plain", "CREATE",
              trainjob_body("new-plain", suspend=False)),
        Write("create a queued TrainJob (Kueue label, suspended)", ALICE, tj, ns, "new-queued",
              "CREATE", trainjob_body("new-queued", queue="user-queue", suspend=True)),
        Write("create its Workload, Kueue-style (job-uid label, controller owner)", KUEUE, wl,
              ns, "new-wl", "CREATE", workload_body("new-wl", trainjob=objects["queued"])),
        Write("admit: unsuspend a queued TrainJob", KUEUE, tj, ns, "queued", "UPDATE",
              {"spec": {"suspend": False}}),
        Write("preempt: suspend an admitted TrainJob", KUEUE, tj, ns, "admitted", "UPDATE",
              {"spec": {"suspend": True}}),
        Write("suspend a TrainJob with no queue label", ALICE, tj, ns, "plain", "UPDATE",
              {"spec": {"suspend": True}}),
        Write("change labels of a queued TrainJob", ALICE, tj, ns, "queued", "UPDATE",
              {"metadata": {"labels": {"team": "a"}}}),
        Write("move a queued TrainJob to another queue", ALICE, tj, ns, "queued", "UPDATE",
              {"metadata": {"labels": {QUEUE_NAME_LABEL: "other-queue"}}}),
        Write("Open: write `P/opened`", SUPERVISOR, tj, ns, "queued", "UPDATE",
              {"metadata": {"annotations": {A.opened: "2026-12-02T12:01:00Z"}}}),
        Write("raise `P/attempt`", GATE, tj, ns, "opened", "UPDATE",
              {"metadata": {"annotations": {A.attempt: "2"}}}, put=True),
        Write("TrainJob status (conditions)", TRAINER, tj, ns, "admitted", "UPDATE",
              {"status": {"conditions": [_condition("Created")]}}, status=True),
        Write("Workload status (quota reserved)", KUEUE, wl, ns, "wl", "UPDATE",
              {"status": {"conditions": [_condition("QuotaReserved")]}}, status=True),
        Write("remove a Workload's finalizer", KUEUE, wl, ns, "wl", "UPDATE",
              {"metadata": {"finalizers": None}}),
        Write("deactivate a Workload (no hold)", ALICE, wl, ns, "wl", "UPDATE",
              {"spec": {"active": False}}),
        Write("reactivate a deactivated Workload (no hold)", ALICE, wl, ns, "wl-off", "UPDATE",
              {"spec": {"active": True}}),
        Write("delete a TrainJob", ALICE, tj, ns, "plain", "DELETE"),
        # -- objects with no hold, refused by kueue-owns-suspend
        Write("unsuspend a queued TrainJob", ALICE, tj, ns, "queued", "UPDATE",
              {"spec": {"suspend": False}}, sent=True),
        Write("drop the queue label and unsuspend", ALICE, tj, ns, "queued", "UPDATE",
              {"metadata": {"labels": {QUEUE_NAME_LABEL: None}}, "spec": {"suspend": False}},
              sent=True),
        Write("suspend an admitted TrainJob", ALICE, tj, ns, "admitted", "UPDATE",
              {"spec": {"suspend": True}}, sent=True),
        # -- holds, releases and writes to held objects
        Write("Hold, plain mode: suspend + hold annotations", SUPERVISOR, tj, ns, "plain",
              "UPDATE", {"metadata": {"annotations": _hold("1")}, "spec": {"suspend": True}},
              sent=True),
        Write("Hold, Kueue mode: deactivate + hold annotations", SUPERVISOR, wl, ns, "wl",
              "UPDATE", {"metadata": {"annotations": _hold("1")}, "spec": {"active": False}},
              sent=True, put=True),
        Write("unsuspend a held TrainJob", ALICE, tj, ns, "held", "UPDATE",
              {"spec": {"suspend": False}}, sent=True),
        Write("create a held, running TrainJob", ALICE, tj, ns, "new-held", "CREATE",
              held_running, sent=True),
        Write("create a held, active Workload", ALICE, wl, ns, "new-held-wl", "CREATE",
              held_active, sent=True),
        Write("reactivate a held Workload", ALICE, wl, ns, "wl-held", "UPDATE",
              {"spec": {"active": True}}, sent=True),
        Write("lower the hold instance", ALICE, wl, ns, "wl-held", "UPDATE",
              {"metadata": {"annotations": {A.hold_instance: "1"}}}, sent=True),
        Write("garble the hold instance", ALICE, tj, ns, "held", "UPDATE",
              {"metadata": {"annotations": {A.hold_instance: "03"}}}, sent=True),
        Write("Release, plain mode: drop hold annotations + unsuspend", SUPERVISOR, tj, ns,
              "held", "UPDATE", {"metadata": {"annotations": drop_hold},
                                 "spec": {"suspend": False}}, sent=True),
        Write("Release, Kueue mode: drop hold annotations + activate", SUPERVISOR, wl, ns,
              "wl-held", "UPDATE", {"metadata": {"annotations": drop_hold},
                                    "spec": {"active": True}}, sent=True, put=True),
        Write("remove a held Workload's finalizer", KUEUE, wl, ns, "wl-held", "UPDATE",
              {"metadata": {"finalizers": None}}, sent=True),
        Write("change labels of a held TrainJob", ALICE, tj, ns, "held", "UPDATE",
              {"metadata": {"labels": {"team": "a"}}}, sent=True),
        Write("held Workload status (evicted)", KUEUE, wl, ns, "wl-held", "UPDATE",
              {"status": {"conditions": [_condition("Evicted")]}}, status=True),
        Write("delete a held Workload", ALICE, wl, ns, "wl-held", "DELETE", sent=True),
        # -- namespaces the selector leaves out
        Write("unsuspend a held TrainJob in kube-system", ALICE, tj, "kube-system",
              name("kube-system"), "UPDATE", {"spec": {"suspend": False}}),
        Write(f"unsuspend a held TrainJob in {OWN_NAMESPACE}", ALICE, tj, OWN_NAMESPACE,
              name(OWN_NAMESPACE), "UPDATE", {"spec": {"suspend": False}}),
    ]  # fmt: skip


TABLE_BEGIN = (
    "<!-- blast-radius-table: generated by tests/controlplane/test_webhook_blast_radius.py -->"
)
TABLE_END = "<!-- blast-radius-table: end -->"


def _render(outcomes: list[Outcome]) -> str:
    rows = [
        "| # | write | writer | hold on old or new | running enforcer (rules) | enforcer down |",
        "|---|---|---|---|---|---|",
    ]
    for number, outcome in enumerate(outcomes, 1):
        write = outcome.write
        what = write.what.replace("`P/", f"`{A.prefix}/")
        down = "**refused**" if outcome.refused_down else "allowed"
        hold = "yes" if outcome.hold_on_object else "no"
        rows.append(
            f"| {number} | {what} | {write.writer.label} | {hold} | {outcome.verdict} | {down} |"
        )
    return "\n".join(rows)


def _documented_table() -> str:
    text = BLAST_RADIUS_DOC.read_text()
    assert TABLE_BEGIN in text and TABLE_END in text, (
        "docs/explanation/blast-radius.md lost its table markers"
    )
    return text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()


@pytest.mark.controlplane
@pytest.mark.timeout(180)
def test_blast_radius_with_the_enforcer_down(
    cluster: LocalCluster, admin_client: k8s.ApiClient
) -> None:
    suffix = uuid.uuid4().hex[:8]
    with (
        closed_port() as port,
        registered(cluster, {"url": f"https://127.0.0.1:{port}/validate"}, "down") as registration,
    ):
        # Not labelled yet: the objects are made, and every write judged by the pure rules
        # (what a running enforcer would answer), before the dead webhook applies here.
        ns = cluster.create_namespace(f"br-{suffix}")
        _ensure_namespace(admin_client, OWN_NAMESPACE)
        objects = _objects(admin_client, ns, suffix)
        writes = _table_writes(ns, objects)
        outcomes = []
        for write in writes:
            old = None
            if write.operation != "CREATE":
                old = _get(admin_client, write.kind, write.namespace, write.name)
            with cluster.api_client(write.writer.username) as api:
                new = write.run(api)
            verdict, refuse = _judge(write, old, new)
            hold = _has_hold(old) or _has_hold(new)
            outcomes.append(Outcome(write, hold, verdict, refuse))

        # The enforcer is down. The excluded namespaces are labelled first: the apiserver's
        # namespace informer delivers updates in order, so once the probe in ``ns`` is
        # refused, their labels are seen too, and their writes pass only by exclusion.
        for namespace in ("kube-system", OWN_NAMESPACE, ns):
            registration.label(namespace)
        _wait_until_refused(admin_client, registration, ns)
        for outcome in outcomes:
            with cluster.api_client(outcome.write.writer.username) as api:
                try:
                    outcome.write.run(api)
                except ApiException as exc:
                    assert _failed_call(exc, registration), (outcome.write.what, exc.body)
                    outcome.refused_down = True
                    outcome.message = json.loads(exc.body or "{}").get("message", "")

    table = _render(outcomes)
    print("\n" + table)
    for outcome in outcomes:
        assert outcome.refused_down == outcome.write.sent, outcome.write.what
    selected = [o for o in outcomes if o.write.namespace == ns]
    excluded = [o for o in outcomes if o.write.namespace != ns]
    # Writes to objects with no hold that the rules allow: none is refused.
    free = [o for o in selected if not o.hold_on_object and not o.rules_refuse]
    assert len(free) >= 15 and not [o.write.what for o in free if o.refused_down]
    # Every write a running enforcer refuses is still refused with it down.
    breaking = [o for o in selected if o.rules_refuse]
    assert len(breaking) >= 9 and all(o.refused_down for o in breaking)
    # Sent means: a judged write (CREATE or UPDATE, no sub-resource) with a hold on the old
    # or new object, or the kueue-owns-suspend case. Status writes and a TrainJob's DELETE
    # never are; a Workload's DELETE is when it is held (held-workload-kept).
    for o in selected:
        trainjob_delete = o.write.operation == "DELETE" and o.write.kind == TRAINJOB.kind
        judged = not (o.write.status or trainjob_delete)
        expected = judged and (o.hold_on_object or o.rules_refuse)
        assert o.refused_down == expected, o.write.what
    # kube-system and holdwarden's namespace are not judged at all, even hold-breaking writes.
    assert excluded and all(o.rules_refuse and not o.refused_down for o in excluded)
    assert _documented_table() == table, (
        "docs/explanation/blast-radius.md differs from this run; the table is:\n" + table
    )


# --- a counting webhook: the conditions, evaluated by the apiserver -------------------------


@dataclass
class Counter:
    """Every AdmissionReview request the apiserver delivered, in order."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, request: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(request)

    def since(self, index: int) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests[index:])

    def __len__(self) -> int:
        with self.lock:
            return len(self.requests)


@contextlib.contextmanager
def counting_webhook(work: Path) -> Iterator[tuple[Counter, int, bytes]]:
    """A TLS webhook on 127.0.0.1 that allows everything and records what it was sent.

    It runs on its own event loop in a thread, since the Kubernetes client is synchronous.
    Yields the counter, the port and the CA bundle the apiserver must trust.
    """
    ca = generate_ca()
    leaf = generate_serving(ca, "counter", "default", ip_addresses=["127.0.0.1"])
    (work / "tls.crt").write_bytes(leaf.cert_pem)
    (work / "tls.key").write_bytes(leaf.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(work / "tls.crt", work / "tls.key")
    counter = Counter()

    async def validate(request: web.Request) -> web.Response:
        review = await request.json()
        counter.record(review["request"])
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
        )

    app = web.Application()
    app.router.add_post("/validate", validate)
    runner = web.AppRunner(app)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="counting-webhook", daemon=True)
    thread.start()

    async def start() -> int:
        async with asyncio.timeout(20):
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            return int(runner.addresses[0][1])

    async def stop() -> None:
        async with asyncio.timeout(20):
            await runner.cleanup()

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield counter, port, ca.cert_pem
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@dataclass(frozen=True)
class State:
    """The parts of an object the rules and the conditions read."""

    annotations: tuple[tuple[str, str], ...]
    queue: bool
    flag: bool | None  # spec.suspend of a TrainJob, spec.active of a Workload; None: absent

    def body(self, kind: str, name: str) -> dict[str, Any]:
        if kind == TRAINJOB.kind:
            body = trainjob_body(name, queue="q" if self.queue else None, suspend=self.flag)
        else:
            body = workload_body(name, active=self.flag)
            if self.queue:
                body["metadata"]["labels"] = {QUEUE_NAME_LABEL: "q"}
        if self.annotations:
            body["metadata"]["annotations"] = dict(self.annotations)
        return body


@dataclass(frozen=True)
class Case:
    kind: str
    operation: str
    writer: Writer
    old: State | None
    new: State


# Valid, boundary and garbled instances: the space hold-instance-malformed/-monotonic judge.
INSTANCES = ["1", "2", "5", "9223372036854775807", "0", "01", "-3", " 4", "x", ""]


@st.composite
def states(draw: st.DrawFn) -> State:
    annotations: dict[str, str] = {}
    # A third of the objects carry no hold at all (the writes that must not be sent); the
    # rest mostly carry a hold-instance (the refusal space), some only a partial hold.
    if draw(st.integers(0, 2)) > 0:
        if draw(st.integers(0, 3)) > 0:
            annotations[A.hold_instance] = draw(st.sampled_from(INSTANCES))
        for key in (A.hold_reason, A.held_at, A.held_by):
            if draw(st.booleans()):
                annotations[key] = "x"
    if draw(st.booleans()):
        annotations[A.opened] = "2026-12-02T12:00:00Z"
    return State(
        tuple(sorted(annotations.items())),
        queue=draw(st.booleans()),
        flag=draw(st.sampled_from([None, True, False])),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    operation = draw(st.sampled_from(["CREATE", "UPDATE", "UPDATE"]))
    kind = draw(st.sampled_from([TRAINJOB.kind, WORKLOAD.kind]))
    # Each writer within its RBAC: Kueue updates TrainJobs but does not create them.
    writers = [ALICE, SUPERVISOR]
    if not (kind == TRAINJOB.kind and operation == "CREATE"):
        writers.append(KUEUE)
    return Case(
        kind=kind,
        operation=operation,
        writer=draw(st.sampled_from(writers)),
        old=draw(states()) if operation == "UPDATE" else None,
        new=draw(states()),
    )


def _model_sends(kind: str, old: Any, new: Any, writer: Writer) -> bool:
    """The documented conditions, read independently of the CEL (webhook/match_conditions)."""
    if _has_hold(old) or _has_hold(new):
        return True
    if kind != TRAINJOB.kind or old is None:
        return False

    def suspended(obj: Any) -> bool:
        return (obj.get("spec") or {}).get("suspend") is True

    def queued(obj: Any) -> bool:
        return QUEUE_NAME_LABEL in ((obj.get("metadata") or {}).get("labels") or {})

    return suspended(old) != suspended(new) and (queued(old) or queued(new)) and not writer.is_kueue


def _change_from_review(request: dict[str, Any]) -> Change:
    user = request.get("userInfo") or {}
    return Change(
        group=request["resource"]["group"],
        resource=request["resource"]["resource"],
        subresource=request.get("subResource") or "",
        operation=request["operation"],
        namespace=request.get("namespace") or "",
        name=request.get("name") or "",
        username=user.get("username") or "",
        groups=tuple(user.get("groups") or ()),
        old=request.get("oldObject"),
        new=request.get("object"),
    )


@pytest.mark.controlplane
@pytest.mark.timeout(180)
def test_every_refused_write_reaches_the_webhook(cluster: LocalCluster, tmp_path: Path) -> None:
    """Any write the pure rules refuse passes the shipped matchConditions (the apiserver
    sends it), and the apiserver sends exactly what the documented conditions say."""
    budget = time.monotonic() + 120  # generation stops early on a very slow machine
    seen = {"examples": 0, "refused": 0, "sent": 0}
    names = itertools.count()
    with contextlib.ExitStack() as webhook:
        counter, port, ca_pem = webhook.enter_context(counting_webhook(tmp_path))
        bundle = base64.b64encode(ca_pem).decode()
        client_config = {"url": f"https://127.0.0.1:{port}/validate", "caBundle": bundle}
        registration = webhook.enter_context(registered(cluster, client_config, "count"))
        ns = cluster.create_namespace(f"brp-{uuid.uuid4().hex[:8]}")
        registration.label(ns)
        with contextlib.ExitStack() as stack:
            admin = stack.enter_context(cluster.api_client())
            clients = {
                writer: stack.enter_context(cluster.api_client(writer.username))
                for writer in (ALICE, KUEUE, SUPERVISOR)
            }
            _wait_until_counted(admin, counter, ns)

            @settings(
                max_examples=70,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(case=cases())
            def check(case: Case) -> None:
                if time.monotonic() > budget:
                    return
                name = f"p{next(names)}"
                coords = _coords(case.kind)
                old = None
                if case.old is not None:
                    old = dict(_create(admin, ns, case.old.body(case.kind, name), dry=False))
                before = len(counter)
                api = clients[case.writer]
                body = case.new.body(case.kind, name)
                if old is None:
                    new = _create(api, ns, body, dry=True)
                else:
                    body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                    new = k8s.CustomObjectsApi(api).replace_namespaced_custom_object(
                        coords.group, coords.version, ns, coords.plural, name, body,
                        dry_run="All", _request_timeout=REQUEST_TIMEOUT,
                    )  # fmt: skip
                delivered = [
                    r for r in counter.since(before)
                    if r.get("name") == name and r["operation"] == case.operation
                ]  # fmt: skip
                assert len(delivered) <= 1, delivered
                change = Change(
                    coords.group, coords.plural, "", case.operation, ns, name,
                    case.writer.username, case.writer.groups, old, new,
                )  # fmt: skip
                refused = _refused(change)
                if delivered:
                    (request,) = delivered
                    # What this test reconstructs is what the webhook was sent.
                    assert set(request["userInfo"]["groups"]) == set(case.writer.groups)
                    assert _refused(_change_from_review(request)) == refused
                seen["examples"] += 1
                seen["refused"] += refused
                seen["sent"] += bool(delivered)
                # The property: a write the rules refuse is never kept from the enforcer.
                assert not refused or delivered, (case, new)
                # And the conditions are exactly the documented ones (no more is sent).
                assert bool(delivered) == _model_sends(case.kind, old, new, case.writer), case

            check()
    print(f"\nmatchConditions property: {seen}")
    # Not vacuous: the generated writes covered refusals and writes that are not sent.
    assert seen["examples"] >= 30, seen
    assert seen["refused"] >= 10 and seen["examples"] - seen["sent"] >= 3, seen


def _wait_until_counted(admin: k8s.ApiClient, counter: Counter, namespace: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        before = len(counter)
        _create(admin, namespace, _held_running_probe(), dry=True)
        if len(counter) > before:
            return
        time.sleep(0.2)
    raise AssertionError("the apiserver never called the counting webhook")


@pytest.mark.controlplane
def test_an_overlay_expression_compiles_in_the_apiserver(admin_client: k8s.ApiClient) -> None:
    """The expression for another prefix and identities is valid CEL for this apiserver
    (the apiserver compiles matchConditions when the configuration is written)."""
    hook = shipped_webhook()
    hook["matchConditions"] = [
        {"name": "could-break-a-hold", "expression": render("example.com", ["kueue-writers"])}
    ]
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"holdwarden-overlay-{uuid.uuid4().hex[:8]}"},
        "webhooks": [hook],
    }
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        body, dry_run="All", _request_timeout=REQUEST_TIMEOUT
    )
    broken = copy.deepcopy(body)
    broken["webhooks"][0]["matchConditions"][0]["expression"] = "object.metadata. ||"
    with pytest.raises(ApiException) as info:  # a bad expression would be refused here
        k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
            broken, dry_run="All", _request_timeout=REQUEST_TIMEOUT
        )
    assert info.value.status == 422


@pytest.mark.controlplane
@pytest.mark.timeout(120)
def test_an_overlay_routes_by_its_own_prefix_and_identities(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The conditions rendered for another annotationPrefix and a Kueue identity given as a
    group: the apiserver sends holds under that prefix only, and lets the group's suspend
    changes through without a call (the groups half of the identity check)."""
    group = "holdwarden-test:kueue-writers"
    conditions = [{"name": "could-break-a-hold", "expression": render("example.com", [group])}]
    with contextlib.ExitStack() as stack:
        counter, port, ca_pem = stack.enter_context(counting_webhook(tmp_path))
        bundle = base64.b64encode(ca_pem).decode()
        client_config = {"url": f"https://127.0.0.1:{port}/validate", "caBundle": bundle}
        registration = stack.enter_context(
            registered(cluster, client_config, "overlay", match_conditions=conditions)
        )
        ns = cluster.create_namespace(f"bro-{uuid.uuid4().hex[:8]}")
        admin = stack.enter_context(cluster.api_client())
        alice = stack.enter_context(cluster.api_client(EDITOR_USER))
        alice_as_kueue = stack.enter_context(cluster.api_client(EDITOR_USER, groups=[group]))
        queued = dict(
            _create(admin, ns, trainjob_body("queued", queue="q", suspend=True), dry=False)
        )
        registration.label(ns)

        def held(prefix: str) -> dict[str, Any]:
            body = trainjob_body(f"held-{uuid.uuid4().hex[:6]}", suspend=True)
            body["metadata"]["annotations"] = {f"{prefix}/hold-instance": "1"}
            return body

        # Wait until the registration applies here (the apiserver caches both).
        deadline = time.monotonic() + 30
        while True:
            before = len(counter)
            _create(admin, ns, held("example.com"), dry=True)
            if len(counter) > before:
                break
            assert time.monotonic() < deadline, "the apiserver never called the counting webhook"
            time.sleep(0.2)

        unsuspend = Write("unsuspend", ALICE, TRAINJOB.kind, ns, "queued", "UPDATE",
                          {"spec": {"suspend": False}})  # fmt: skip

        def hold(prefix: str) -> Callable[[], object]:
            return lambda: _create(alice, ns, held(prefix), dry=True)

        writes: list[tuple[str, Callable[[], object], bool]] = [
            ("hold under the overlay's prefix", hold("example.com"), True),
            ("hold under the default prefix", hold("holdwarden.io"), False),
            ("alice unsuspends a queued TrainJob", lambda: unsuspend.run(alice), True),
            (
                "alice in the Kueue group unsuspends it",
                lambda: unsuspend.run(alice_as_kueue),
                False,
            ),
        ]
        for what, write, sent in writes:
            before = len(counter)
            write()
            assert (len(counter) > before) == sent, what
        # Dry runs all: nothing was stored.
        stored = _get(admin, TRAINJOB.kind, ns, "queued")
        assert stored["metadata"]["resourceVersion"] == queued["metadata"]["resourceVersion"]
