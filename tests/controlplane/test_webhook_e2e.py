"""The enforcer end to end in the real kube-apiserver.

The server runs in this process (its own thread and event loop, TLS with a certificate from
``holdwarden.certs.generate`` for IP 127.0.0.1); a ValidatingWebhookConfiguration points the real
apiserver at it, with the shipped ``matchConditions`` (read from manifests/webhook.yaml), so
these tests go through the same narrowing the installed enforcer does. The configuration
only matches namespaces carrying this module's own label with a random value, so no other
test is ever judged by it, and it is deleted at the end of the module.

Writes are made the ways people and tools make them (merge patch, JSON patch, update,
server-side apply) as the impersonated editor ``alice``, by Kueue and by Trainer.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.config import Config, WebhookConfig
from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from holdwarden.webhook.audit import read_audit
from rig.builders import trainjob_body, workload_body
from rig.localcluster import LocalCluster
from rig.localcluster.realstory import wait_until_enforced
from tests.support.enforcer_tls import run_in_thread
from tests.support.shipped_webhook import (
    local_registration,
    local_webhook,
    shipped_rules,
)

pytestmark = pytest.mark.controlplane

A = Annotations()
E2E_LABEL = "holdwarden.io/webhook-e2e"
WEBHOOK_NAME = "holds.holdwarden.io"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass
class Enforcer:
    server: EnforcerServer
    audit_log: Path
    token: str
    cluster: LocalCluster
    ca_path: Path

    def namespace(self) -> str:
        return self.cluster.create_namespace(
            f"wh-{uuid.uuid4().hex[:10]}", labels={E2E_LABEL: self.token}
        )

    def audit(self) -> list[dict[str, Any]]:
        return read_audit(self.audit_log).records


def _serve_in_thread(
    config: Config, tls: ReloadingTLS
) -> tuple[EnforcerServer, Callable[[], None]]:
    server = EnforcerServer(config, tls=tls)
    return server, run_in_thread(server)


@pytest.fixture(scope="module")
def enforcer(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Enforcer]:
    work = tmp_path_factory.mktemp("enforcer")
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
    server, stop = _serve_in_thread(config, ReloadingTLS(work / "tls.crt", work / "tls.key"))
    token = uuid.uuid4().hex[:12]
    vwc_name = f"holdwarden-e2e-{token}"
    # The shipped rules (manifests/webhook.yaml): DELETE for Workloads too.
    rules = shipped_rules()
    # What ships: the apiserver sends only the writes that could break a hold.
    body: Any = local_registration(
        vwc_name,
        local_webhook(
            server.port, {E2E_LABEL: token}, ca_pem=ca.cert_pem, name=WEBHOOK_NAME, rules=rules
        ),
    )
    with cluster.api_client() as admin:
        registrations = k8s.AdmissionregistrationV1Api(admin)
        registrations.create_validating_webhook_configuration(body)
        try:
            hook = Enforcer(server, work / "audit.jsonl", token, cluster, work / "ca.crt")
            wait_until_enforced(admin, hook.namespace())
            yield hook
        finally:
            registrations.delete_validating_webhook_configuration(vwc_name)
            stop()


# --- helpers ---------------------------------------------------------------------------------


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def hold_annotations(instance: str) -> dict[str, str]:
    return {
        A.hold_instance: instance,
        A.hold_reason: "node lost",
        A.held_at: "2026-12-02T12:00:00Z",
        A.held_by: "dispatch",
    }


def create(api: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    coords = TRAINJOB if body["kind"] == TRAINJOB.kind else WORKLOAD
    created: Any = custom(api).create_namespaced_custom_object(
        coords.group, coords.version, namespace, coords.plural, body
    )
    return dict(created)


def get(api: k8s.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any]:
    coords = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    got: Any = custom(api).get_namespaced_custom_object(
        coords.group, coords.version, namespace, coords.plural, name
    )
    return dict(got)


def patch(
    api: k8s.ApiClient,
    kind: str,
    namespace: str,
    name: str,
    body: Any,
    content_type: str,
    *,
    dry_run: bool = False,
    status: bool = False,
) -> dict[str, Any]:
    coords = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    extra: dict[str, Any] = {"_content_type": content_type}
    if dry_run:
        extra["dry_run"] = "All"
    if content_type == APPLY:
        extra["field_manager"] = "alice-tool"
        extra["force"] = True
    method = (
        custom(api).patch_namespaced_custom_object_status
        if status
        else custom(api).patch_namespaced_custom_object
    )
    result: Any = method(
        coords.group, coords.version, namespace, coords.plural, name, body, **extra
    )
    return cast(dict[str, Any], result)


def replace(api: k8s.ApiClient, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    coords = TRAINJOB if obj["kind"] == TRAINJOB.kind else WORKLOAD
    meta = obj["metadata"]
    extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    result: Any = custom(api).replace_namespaced_custom_object(
        coords.group, coords.version, meta["namespace"], coords.plural, meta["name"], obj, **extra
    )
    return cast(dict[str, Any], result)


def refused(write: Callable[[], object], rule: str) -> str:
    """Run a write that must be refused by ``rule``; return the apiserver's message."""
    with pytest.raises(ApiException) as info:
        write()
    assert info.value.status == 403, info.value.body
    message = str(json.loads(info.value.body or "{}")["message"])
    assert f'admission webhook "{WEBHOOK_NAME}" denied the request' in message
    assert f"holdwarden [{rule}]" in message, message
    return message


def apply_body(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]},
        "spec": spec,
    }


# --- plain mode: a held TrainJob ----------------------------------------------------------------


def held_trainjob(admin: k8s.ApiClient, namespace: str, instance: str = "3") -> dict[str, Any]:
    body = trainjob_body(f"tj-{uuid.uuid4().hex[:6]}", suspend=True)
    body["metadata"]["annotations"] = hold_annotations(instance)
    return create(admin, namespace, body)


def unsuspend_writes(obj: dict[str, Any]) -> dict[str, Callable[[k8s.ApiClient, bool], object]]:
    """Four ways to write spec.suspend=false that keep the hold annotations."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]

    def update(api: k8s.ApiClient, dry: bool) -> object:
        fresh = get(api, TRAINJOB.kind, ns, name)
        fresh["spec"]["suspend"] = False
        return replace(api, fresh, dry_run=dry)

    return {
        "merge patch": lambda api, dry: patch(
            api, TRAINJOB.kind, ns, name, {"spec": {"suspend": False}}, MERGE, dry_run=dry
        ),
        "json patch": lambda api, dry: patch(
            api,
            TRAINJOB.kind,
            ns,
            name,
            [{"op": "replace", "path": "/spec/suspend", "value": False}],
            JSON_PATCH,
            dry_run=dry,
        ),
        "update": update,
        "server-side apply": lambda api, dry: patch(
            api,
            TRAINJOB.kind,
            ns,
            name,
            apply_body(obj, suspend=False, runtimeRef={"name": "torch-distributed"}),
            APPLY,
            dry_run=dry,
        ),
    }


def test_unsuspending_a_held_trainjob_is_refused_every_way(
    enforcer: Enforcer, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    job = held_trainjob(admin_client, ns)
    name = job["metadata"]["name"]
    for how, write in unsuspend_writes(job).items():
        before = len(enforcer.audit())
        message = refused(partial(write, editor_client, False), "held-trainjob-suspended")
        assert f"TrainJob {ns}/{name}" in message, how
        assert f"holdwarden release {ns}/{name} --instance 3" in message, how
        after = get(admin_client, TRAINJOB.kind, ns, name)
        assert after["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"], how
        assert after["spec"]["suspend"] is True
        lines = enforcer.audit()[before:]
        assert len(lines) == 1, how
        line = lines[0]
        assert (line["rule"], line["user"], line["namespace"], line["name"]) == (
            "held-trainjob-suspended",
            "alice",
            ns,
            name,
        )
        assert line["operation"] == "UPDATE" and line["dryRun"] is False
        assert (line["oldSuspend"], line["newSuspend"], line["instance"]) == (True, False, "3")
        assert "system:authenticated" in line["groups"]


def test_dry_run_writes_are_judged_the_same_and_marked(
    enforcer: Enforcer, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    job = held_trainjob(admin_client, ns)
    for how, write in unsuspend_writes(job).items():
        before = len(enforcer.audit())
        refused(partial(write, editor_client, True), "held-trainjob-suspended")
        lines = enforcer.audit()[before:]
        assert [line["dryRun"] for line in lines] == [True], how
    after = get(admin_client, TRAINJOB.kind, ns, job["metadata"]["name"])
    assert after["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]


def test_the_same_write_that_releases_passes(
    enforcer: Enforcer, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    drop = {key: None for key in A.hold_keys}
    # merge patch
    job = held_trainjob(admin_client, ns)
    name = job["metadata"]["name"]
    done = patch(
        editor_client,
        TRAINJOB.kind,
        ns,
        name,
        {"metadata": {"annotations": drop}, "spec": {"suspend": False}},
        MERGE,
    )
    assert done["spec"]["suspend"] is False
    assert A.hold_instance not in (done["metadata"].get("annotations") or {})
    # JSON patch
    job = held_trainjob(admin_client, ns)
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": "/metadata/annotations/" + key.replace("/", "~1")}
        for key in A.hold_keys
    ]
    ops.append({"op": "replace", "path": "/spec/suspend", "value": False})
    done = patch(editor_client, TRAINJOB.kind, ns, job["metadata"]["name"], ops, JSON_PATCH)
    assert done["spec"]["suspend"] is False
    # update
    job = held_trainjob(admin_client, ns)
    fresh = get(editor_client, TRAINJOB.kind, ns, job["metadata"]["name"])
    fresh["metadata"]["annotations"] = {}
    fresh["spec"]["suspend"] = False
    assert replace(editor_client, fresh)["spec"]["suspend"] is False
    # server-side apply: the manager that applied the hold applies again without it
    applied_name = f"tj-ssa-{uuid.uuid4().hex[:6]}"
    held = trainjob_body(applied_name, suspend=True)
    held["metadata"]["namespace"] = ns
    held["metadata"]["annotations"] = hold_annotations("4")
    patch(editor_client, TRAINJOB.kind, ns, applied_name, held, APPLY)
    still_held = apply_body(held, suspend=False, runtimeRef={"name": "torch-distributed"})
    still_held["metadata"]["annotations"] = hold_annotations("4")
    refused(
        lambda: patch(editor_client, TRAINJOB.kind, ns, applied_name, still_held, APPLY),
        "held-trainjob-suspended",
    )
    released = apply_body(held, suspend=False, runtimeRef={"name": "torch-distributed"})
    done = patch(editor_client, TRAINJOB.kind, ns, applied_name, released, APPLY)
    assert done["spec"]["suspend"] is False
    assert A.hold_instance not in (done["metadata"].get("annotations") or {})


def test_lowering_or_garbling_the_instance_is_refused(
    enforcer: Enforcer, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    job = held_trainjob(admin_client, ns, instance="5")
    name = job["metadata"]["name"]
    key_path = "/metadata/annotations/" + A.hold_instance.replace("/", "~1")
    lower: dict[str, Callable[[], object]] = {
        "merge patch": lambda: patch(
            editor_client, TRAINJOB.kind, ns, name,
            {"metadata": {"annotations": {A.hold_instance: "4"}}}, MERGE,
        ),
        "json patch": lambda: patch(
            editor_client, TRAINJOB.kind, ns, name,
            [{"op": "replace", "path": key_path, "value": "2"}], JSON_PATCH,
        ),
    }  # fmt: skip
    lowered = apply_body(job, suspend=True, runtimeRef={"name": "torch-distributed"})
    lowered["metadata"]["annotations"] = {A.hold_instance: "1"}
    lower["server-side apply"] = lambda: patch(
        editor_client, TRAINJOB.kind, ns, name, lowered, APPLY
    )
    for how, write in lower.items():
        message = refused(write, "hold-instance-monotonic")
        assert "instance 5" in message, how
    for garbage in ("05", "0", "-1", "five", ""):
        refused(
            partial(
                patch, editor_client, TRAINJOB.kind, ns, name,
                {"metadata": {"annotations": {A.hold_instance: garbage}}}, MERGE,
            ),
            "hold-instance-malformed",
        )  # fmt: skip
    fresh = get(editor_client, TRAINJOB.kind, ns, name)
    fresh["metadata"]["annotations"][A.hold_instance] = "3"
    refused(lambda: replace(editor_client, fresh), "hold-instance-monotonic")
    after = get(admin_client, TRAINJOB.kind, ns, name)
    assert after["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]
    # Raising the instance (a newer hold) is allowed.
    raised = patch(
        editor_client, TRAINJOB.kind, ns, name,
        {"metadata": {"annotations": {A.hold_instance: "6"}}}, MERGE,
    )  # fmt: skip
    assert raised["metadata"]["annotations"][A.hold_instance] == "6"


def test_creating_a_held_running_trainjob_is_refused(
    enforcer: Enforcer, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    body = trainjob_body("born-held", suspend=False)
    body["metadata"]["annotations"] = hold_annotations("1")
    refused(lambda: create(editor_client, ns, body), "held-trainjob-suspended")
    body["metadata"]["annotations"][A.hold_instance] = "01"
    body["spec"]["suspend"] = True
    refused(lambda: create(editor_client, ns, body), "hold-instance-malformed")


# --- Kueue mode: a held Workload, and who owns spec.suspend -------------------------------------


def test_reactivating_a_held_workload_is_refused_every_way(
    enforcer: Enforcer, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = enforcer.namespace()
    job = create(admin_client, ns, trainjob_body("kjob", queue="user-queue", suspend=True))
    wl_body = workload_body("kjob-wl", trainjob=job, active=False)
    wl_body["metadata"]["annotations"] = hold_annotations("2")
    wl = create(admin_client, ns, wl_body)
    name, rv = wl["metadata"]["name"], wl["metadata"]["resourceVersion"]

    def update(dry: bool) -> object:
        fresh = get(editor_client, WORKLOAD.kind, ns, name)
        fresh["spec"]["active"] = True
        return replace(editor_client, fresh, dry_run=dry)

    writes: dict[str, Callable[[bool], object]] = {
        "merge patch": lambda dry: patch(
            editor_client, WORKLOAD.kind, ns, name, {"spec": {"active": True}}, MERGE, dry_run=dry
        ),
        "json patch": lambda dry: patch(
            editor_client, WORKLOAD.kind, ns, name,
            [{"op": "replace", "path": "/spec/active", "value": True}], JSON_PATCH, dry_run=dry,
        ),
        "json patch remove (absent means active)": lambda dry: patch(
            editor_client, WORKLOAD.kind, ns, name,
            [{"op": "remove", "path": "/spec/active"}], JSON_PATCH, dry_run=dry,
        ),
        "update": update,
        "server-side apply": lambda dry: patch(
            editor_client, WORKLOAD.kind, ns, name,
            apply_body(wl, active=True), APPLY, dry_run=dry,
        ),
    }  # fmt: skip
    for how, write in writes.items():
        for dry in (False, True):
            before = len(enforcer.audit())
            message = refused(partial(write, dry), "held-workload-inactive")
            assert f"Workload {ns}/{name}" in message, how
            assert f"holdwarden release {ns}/kjob --instance 2" in message, how
            line = enforcer.audit()[before:][0]
            assert (line["dryRun"], line["oldActive"], line["newActive"]) == (dry, False, True)
    assert get(admin_client, WORKLOAD.kind, ns, name)["metadata"]["resourceVersion"] == rv

    # Release: the same write also removes the hold annotations.
    drop = {key: None for key in A.hold_keys}
    released = patch(
        editor_client, WORKLOAD.kind, ns, name,
        {"metadata": {"annotations": drop}, "spec": {"active": True}}, MERGE,
    )  # fmt: skip
    assert released["spec"]["active"] is True


def test_only_kueue_may_change_suspend_of_a_kueue_managed_trainjob(
    enforcer: Enforcer,
    admin_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
) -> None:
    ns = enforcer.namespace()
    job = create(admin_client, ns, trainjob_body("queued", queue="user-queue", suspend=True))
    name = job["metadata"]["name"]
    message = refused(
        lambda: patch(editor_client, TRAINJOB.kind, ns, name, {"spec": {"suspend": False}}, MERGE),
        "kueue-owns-suspend",
    )
    assert "alice" in message
    # Dropping the queue label in the same write does not escape the rule.
    refused(
        lambda: patch(
            editor_client, TRAINJOB.kind, ns, name,
            {"metadata": {"labels": {QUEUE_NAME_LABEL: None}}, "spec": {"suspend": False}}, MERGE,
        ),
        "kueue-owns-suspend",
    )  # fmt: skip
    assert get(admin_client, TRAINJOB.kind, ns, name)["spec"]["suspend"] is True
    admitted = patch(kueue_client, TRAINJOB.kind, ns, name, {"spec": {"suspend": False}}, MERGE)
    assert admitted["spec"]["suspend"] is False
    refused(
        lambda: patch(editor_client, TRAINJOB.kind, ns, name, {"spec": {"suspend": True}}, MERGE),
        "kueue-owns-suspend",
    )
    evicted = patch(kueue_client, TRAINJOB.kind, ns, name, {"spec": {"suspend": True}}, MERGE)
    assert evicted["spec"]["suspend"] is True
    # Other fields stay the user's to change.
    relabelled = patch(
        editor_client, TRAINJOB.kind, ns, name, {"metadata": {"labels": {"team": "a"}}}, MERGE
    )
    assert relabelled["metadata"]["labels"]["team"] == "a"


# --- never blocked ---------------------------------------------------------------------------


def test_status_writes_and_unrelated_objects_are_never_blocked(
    enforcer: Enforcer,
    admin_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
) -> None:
    ns = enforcer.namespace()
    before = len(enforcer.audit())
    # Controllers' status writes on held objects pass (the sub-resource is not judged).
    job = held_trainjob(admin_client, ns)
    name = job["metadata"]["name"]
    condition = {
        "type": "Suspended",
        "status": "True",
        "reason": "Suspended",
        "message": "held",
        "lastTransitionTime": "2026-12-02T12:00:00Z",
    }
    status = patch(
        trainer_client, TRAINJOB.kind, ns, name,
        {"status": {"conditions": [condition]}}, MERGE, status=True,
    )  # fmt: skip
    assert status["status"]["conditions"][0]["type"] == "Suspended"

    wl_body = workload_body("held-wl", active=False)
    wl_body["metadata"]["annotations"] = hold_annotations("2")
    wl = create(admin_client, ns, wl_body)
    evicted = dict(condition, type="Evicted", reason="Deactivated")
    done = patch(
        kueue_client, WORKLOAD.kind, ns, wl["metadata"]["name"],
        {"status": {"conditions": [evicted]}}, MERGE, status=True,
    )  # fmt: skip
    assert done["status"]["conditions"][0]["type"] == "Evicted"

    # A TrainJob with no hold, not Kueue-managed: the user may suspend and unsuspend it.
    free = create(admin_client, ns, trainjob_body("free", suspend=True))
    for value in (False, True, False):
        out = patch(
            editor_client, TRAINJOB.kind, ns, free["metadata"]["name"],
            {"spec": {"suspend": value}}, MERGE,
        )  # fmt: skip
        assert out["spec"]["suspend"] is value
    # Unrelated kinds carrying the annotation, and unrelated edits of a held object.
    core = k8s.CoreV1Api(admin_client)
    cm = core.create_namespaced_config_map(
        ns,
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name="cm", annotations={A.hold_instance: "garbage"})
        ),
    )
    assert cm.metadata is not None and cm.metadata.annotations is not None
    assert cm.metadata.annotations[A.hold_instance] == "garbage"
    labelled = patch(
        editor_client, TRAINJOB.kind, ns, name, {"metadata": {"labels": {"x": "y"}}}, MERGE
    )
    assert labelled["metadata"]["labels"]["x"] == "y"
    assert len(enforcer.audit()) == before
    # Deleting a held object is not the enforcer's business.
    custom(editor_client).delete_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, name
    )


def test_namespaces_outside_the_selector_are_untouched(
    enforcer: Enforcer, admin_client: k8s.ApiClient, namespace: str
) -> None:
    body = copy.deepcopy(trainjob_body("outside", suspend=False))
    body["metadata"]["annotations"] = hold_annotations("1")
    created = create(admin_client, namespace, body)
    assert created["spec"]["suspend"] is False
    assert all(line["namespace"] != namespace for line in enforcer.audit())


def test_health_readiness_and_metrics(enforcer: Enforcer) -> None:
    import ssl
    import urllib.request

    tls = enforcer.server.state.tls
    assert tls is not None
    context = ssl.create_default_context(cafile=str(enforcer.ca_path))
    base = f"https://127.0.0.1:{enforcer.server.port}"
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(base + path, context=context, timeout=5) as response:
            assert response.status == 200
    metrics_url = f"http://127.0.0.1:{enforcer.server.metrics_port}/metrics"
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    expiry = [
        line
        for line in text.splitlines()
        if line.startswith("holdwarden_webhook_certificate_expiry_timestamp_seconds ")
    ]
    assert tls.not_after is not None
    assert float(expiry[0].split()[1]) == tls.not_after.timestamp()
    # The fixture's dry-run probe was refused and counted by rule.
    assert (
        'decision="denied",operation="CREATE",resource="trainjobs",rule="held-trainjob-suspended"'
        in text
    )


def test_adapter_preflight_detects_the_real_enforcer(
    enforcer: Enforcer, cluster: LocalCluster, namespace: str
) -> None:
    """Preflight's dry-run probe is refused by this webhook where it is registered, and
    reported as not installed where it is not (a namespace outside its selector)."""
    from holdwarden.adapter import Adapter, Config
    from rig.localcluster import SUPERVISOR_IDENTITY

    # Each mode probes with its own held kind: a Workload in Kueue mode (so no TrainJob
    # webhook, Trainer's or Kueue's, can answer first), a TrainJob in plain mode.
    for mode, rule in (("kueue", "held-workload-inactive"), ("plain", "held-trainjob-suspended")):
        guarded = enforcer.namespace()
        with cluster.api_client(SUPERVISOR_IDENTITY) as api:
            adapter = Adapter(Config(mode=mode), api)  # type: ignore[arg-type]
            inside = adapter.preflight(guarded)
            outside = adapter.preflight(namespace)
        assert inside.enforcer_installed.supported, inside.enforcer_installed.reason
        assert rule in inside.enforcer_installed.reason
        assert not outside.enforcer_installed.supported, outside.enforcer_installed.reason
        probes = [line for line in enforcer.audit() if line["namespace"] == guarded]
        assert probes and all(line["dryRun"] is True for line in probes)
        assert {line["rule"] for line in probes} == {rule}


def test_deleting_a_held_workload_is_refused_but_the_garbage_collector_may(
    enforcer: Enforcer, cluster: LocalCluster, admin_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
) -> None:  # fmt: skip
    """A held Workload deleted would be replaced by Kueue with a fresh, active one that runs
    the job: the hold lost with nobody lifting it. Only the garbage collector (its TrainJob
    is gone) and the namespace controller may delete it."""
    ns = enforcer.namespace()
    job = create(admin_client, ns, trainjob_body("kjob", queue="user-queue", suspend=True))
    wl_body = workload_body("kjob-wl", trainjob=job, active=False)
    wl_body["metadata"]["annotations"] = hold_annotations("2")
    wl = create(admin_client, ns, wl_body)
    name = wl["metadata"]["name"]

    def delete(api: k8s.ApiClient, dry: bool) -> object:
        return k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, name,
            dry_run="All" if dry else None,
        )  # fmt: skip

    for dry in (True, False):
        before = len(enforcer.audit())
        message = refused(partial(delete, editor_client, dry), "held-workload-kept")
        assert f"holdwarden release {ns}/kjob --instance 2" in message
        line = enforcer.audit()[before:][0]
        assert (line["operation"], line["dryRun"], line["instance"]) == ("DELETE", dry, "2")
    assert get(admin_client, WORKLOAD.kind, ns, name)["metadata"]["uid"] == wl["metadata"]["uid"]
    # An unheld Workload is deleted without a call (matchConditions) and without a refusal.
    plain = create(admin_client, ns, workload_body("plain-wl", trainjob=job))
    calls = len(enforcer.audit())
    k8s.CustomObjectsApi(editor_client).delete_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, plain["metadata"]["name"]
    )
    assert len(enforcer.audit()) == calls
    gc = "system:serviceaccount:kube-system:generic-garbage-collector"
    with cluster.api_client(gc, groups=("system:masters",)) as collector:
        delete(collector, False)
    with pytest.raises(ApiException) as gone:
        get(admin_client, WORKLOAD.kind, ns, name)
    assert gone.value.status == 404
