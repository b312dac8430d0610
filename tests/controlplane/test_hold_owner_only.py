"""hold-owner-only on the real kube-apiserver, for both twins, with impersonated writers.

Each test runs twice: once with only the enforcer webhook registered (the real server,
configured with ``webhook.holderIdentities``), once with only the ValidatingAdmissionPolicies
bound (the five rules and ``holdwarden-hold-owner-only``). The holder is the supervisor's
service account; the supervisor acts through the real Adapter. The editor ``alice`` and
Kueue are not holders; break-glass is an identity in ``system:masters``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.adapter import Adapter, CallMeta, Config, Ref
from holdwarden.config import TimeoutsConfig, WebhookConfig
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations, RuleId
from rig.builders import trainjob_body, workload_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from tests.controlplane.test_policy_parity import LABEL, policy_only, webhook_only
from tests.support import policy_corpus as corpus

pytestmark = pytest.mark.controlplane

A = Annotations()
HOLDERS = (SUPERVISOR_IDENTITY,)
OWNER = str(RuleId.HOLD_OWNER_ONLY)
DROP = {key: None for key in A.hold_keys}


@dataclass
class Twin:
    kind: str
    token: str
    cluster: LocalCluster

    def namespace(self) -> str:
        return self.cluster.create_namespace(
            f"own-{uuid.uuid4().hex[:10]}", labels={LABEL: self.token}
        )


@pytest.fixture(scope="module", params=["webhook", "policy"])
def twin(
    request: pytest.FixtureRequest, cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Twin]:
    token = uuid.uuid4().hex[:10]
    found = Twin(str(request.param), token, cluster)
    probe_ns = found.namespace()
    with cluster.api_client() as admin:
        if found.kind == "webhook":
            config = Config(webhook=WebhookConfig(holder_identities=HOLDERS))
            context = webhook_only(admin, probe_ns, token, tmp_path_factory.mktemp("own"), config)
        else:
            context = policy_only(admin, probe_ns, token, holders=HOLDERS)
        with context:
            yield found


def meta(instance: int | None = None) -> CallMeta:
    return CallMeta(deadline=datetime.now(UTC) + timedelta(seconds=20), instance=instance)


def adapter_for(cluster: LocalCluster, api: k8s.ApiClient, holders: tuple[str, ...]) -> Adapter:
    config = Config(
        mode="kueue",
        holder="dispatch",
        timeouts=TimeoutsConfig(apiserver_request=cluster.request_timeout),
        webhook=WebhookConfig(holder_identities=holders),
    )
    return Adapter(config, api)


def verdict(write: Callable[[], object]) -> str:
    try:
        write()
    except ApiException as exc:
        return corpus.verdict_of(exc)
    return "allowed"


def path(key: str) -> str:
    """The JSON pointer of an annotation."""
    return "/metadata/annotations/" + key.replace("/", "~1")


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def merge(api: k8s.ApiClient, kind: str, ns: str, name: str, body: Any) -> Callable[[], object]:
    resource = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    return lambda: custom(api).patch_namespaced_custom_object(
        resource.group, resource.version, ns, resource.plural, name, body,
        _content_type=corpus.MERGE,
    )  # fmt: skip


def json_patch(api: k8s.ApiClient, kind: str, ns: str, name: str, ops: Any) -> Callable[[], object]:
    resource = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    return lambda: custom(api).patch_namespaced_custom_object(
        resource.group, resource.version, ns, resource.plural, name, ops,
        _content_type=corpus.JSON_PATCH,
    )  # fmt: skip


def kueue_job(admin: k8s.ApiClient, kueue: k8s.ApiClient, ns: str) -> tuple[Ref, str]:
    """A Kueue-managed TrainJob and its Workload, as Kueue creates it."""
    name = f"job-{uuid.uuid4().hex[:6]}"
    tj: Any = custom(admin).create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural,
        trainjob_body(name, queue="user-queue", suspend=True),
    )  # fmt: skip
    wl: Any = custom(kueue).create_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural,
        workload_body(f"wl-{name}", trainjob=tj),
    )  # fmt: skip
    return Ref(ns, name), str(wl["metadata"]["name"])


def read(api: k8s.ApiClient, kind: str, ns: str, name: str) -> dict[str, Any]:
    resource = TRAINJOB if kind == TRAINJOB.kind else WORKLOAD
    got: Any = custom(api).get_namespaced_custom_object(
        resource.group, resource.version, ns, resource.plural, name
    )
    return dict(got)


def test_an_editor_cannot_lift_a_hold_and_the_supervisor_can(
    twin: Twin,
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
) -> None:
    ns = twin.namespace()
    ref, wl = kueue_job(admin_client, kueue_client, ns)
    supervisor = adapter_for(cluster, supervisor_client, HOLDERS)
    supervisor.hold(ref, meta(3), "node lost")
    # The one-write lift (drop the annotations, reactivate), by merge and by JSON patch.
    lift = {"metadata": {"annotations": DROP}, "spec": {"active": True}}
    assert verdict(merge(editor_client, WORKLOAD.kind, ns, wl, lift)) == OWNER
    ops: list[dict[str, Any]] = [{"op": "remove", "path": path(k)} for k in A.hold_keys]
    ops.append({"op": "replace", "path": "/spec/active", "value": True})
    assert verdict(json_patch(editor_client, WORKLOAD.kind, ns, wl, ops)) == OWNER
    # The two-write lowering: its first write (remove the instance) is refused.
    remove = [
        {"op": "remove", "path": "/metadata/annotations/" + A.hold_instance.replace("/", "~1")}
    ]
    assert verdict(json_patch(editor_client, WORKLOAD.kind, ns, wl, remove)) == OWNER
    # Reactivating while keeping the annotations is refused too (held-workload-inactive).
    assert verdict(merge(editor_client, WORKLOAD.kind, ns, wl, {"spec": {"active": True}})) in (
        str(RuleId.HELD_WORKLOAD_INACTIVE),
        OWNER,
    )
    held = read(admin_client, WORKLOAD.kind, ns, wl)
    assert held["spec"]["active"] is False
    assert held["metadata"]["annotations"][A.hold_instance] == "3"
    # The supervisor's service account, through the real adapter, may.
    supervisor.release(ref, meta(3))
    released = read(admin_client, WORKLOAD.kind, ns, wl)
    assert released["spec"]["active"] is True
    assert A.hold_instance not in (released["metadata"].get("annotations") or {})
    supervisor.hold(ref, meta(4), "again")
    # Once released, activation is anyone's again; no hold, nothing to own.
    supervisor.release(ref, meta(4))
    off = {"spec": {"active": False}}
    assert verdict(merge(editor_client, WORKLOAD.kind, ns, wl, off)) == "allowed"
    assert verdict(merge(editor_client, WORKLOAD.kind, ns, wl, {"spec": {"active": True}})) == (
        "allowed"
    )


def test_an_editor_cannot_lift_or_place_a_plain_mode_hold(
    twin: Twin, supervisor_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    ns = twin.namespace()
    name = f"tj-{uuid.uuid4().hex[:6]}"
    body = trainjob_body(name, suspend=True)
    body["metadata"]["annotations"] = corpus.hold_set("2", True)
    create = custom(editor_client).create_namespaced_custom_object
    assert verdict(lambda: create(TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, body)) == (
        OWNER
    )
    custom(supervisor_client).create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, ns, TRAINJOB.plural, body
    )
    lift = {"metadata": {"annotations": DROP}, "spec": {"suspend": False}}
    assert verdict(merge(editor_client, TRAINJOB.kind, ns, name, lift)) == OWNER
    reason = {"metadata": {"annotations": {A.hold_reason: "mine now"}}}
    assert verdict(merge(editor_client, TRAINJOB.kind, ns, name, reason)) == OWNER
    # Writes that leave the hold as it is stay the editor's to make.
    labels = {"metadata": {"labels": {"team": "a"}, "annotations": {A.opened: "t"}}}
    assert verdict(merge(editor_client, TRAINJOB.kind, ns, name, labels)) == "allowed"
    assert verdict(merge(supervisor_client, TRAINJOB.kind, ns, name, lift)) == "allowed"


def test_kueue_writes_that_keep_the_hold_pass(
    twin: Twin,
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
) -> None:
    ns = twin.namespace()
    ref, wl = kueue_job(admin_client, kueue_client, ns)
    adapter_for(cluster, supervisor_client, HOLDERS).hold(ref, meta(5), "r")
    touch = {"metadata": {"labels": {"kueue.x-k8s.io/touched": "1"}, "finalizers": []}}
    assert verdict(merge(kueue_client, WORKLOAD.kind, ns, wl, touch)) == "allowed"
    status = {"status": {"conditions": [{
        "type": "Evicted", "status": "True", "reason": "Deactivated", "message": "held",
        "lastTransitionTime": "2026-12-02T12:00:00Z",
    }]}}  # fmt: skip
    assert verdict(
        lambda: custom(kueue_client).patch_namespaced_custom_object_status(
            WORKLOAD.group, WORKLOAD.version, ns, WORKLOAD.plural, wl, status,
            _content_type=corpus.MERGE,
        )
    ) == "allowed"  # fmt: skip
    # Kueue suspends the TrainJob of a deactivated Workload: no hold annotation on it.
    suspend = {"spec": {"suspend": True}}
    assert verdict(merge(kueue_client, TRAINJOB.kind, ns, ref.name, suspend)) == "allowed"
    # But Kueue is no holder: it may not lift the hold either.
    lift = {"metadata": {"annotations": DROP}, "spec": {"active": True}}
    assert verdict(merge(kueue_client, WORKLOAD.kind, ns, wl, lift)) == OWNER


def test_break_glass_for_cluster_admins(
    twin: Twin,
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
) -> None:
    ns = twin.namespace()
    ref, wl = kueue_job(admin_client, kueue_client, ns)
    with cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter_for(cluster, supervisor, HOLDERS).hold(ref, meta(6), "r")
    lift = {"metadata": {"annotations": DROP}, "spec": {"active": True}}
    assert verdict(merge(editor_client, WORKLOAD.kind, ns, wl, lift)) == OWNER
    with cluster.api_client("oncall", groups=["system:masters"]) as glass:
        assert verdict(merge(glass, WORKLOAD.kind, ns, wl, lift)) == "allowed"
    assert read(admin_client, WORKLOAD.kind, ns, wl)["spec"]["active"] is True


def test_preflight_reports_whether_ownership_is_enforced(
    twin: Twin,
    cluster: LocalCluster,
    supervisor_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
) -> None:
    ns = twin.namespace()
    on = adapter_for(cluster, supervisor_client, HOLDERS).preflight(ns)
    assert on.extra["holdOwnership"].supported, on.extra["holdOwnership"].reason
    assert on.enforcer_installed.supported, on.enforcer_installed.reason
    off = adapter_for(cluster, supervisor_client, ()).preflight(ns).extra["holdOwnership"]
    assert not off.supported and "off" in off.reason
    other = adapter_for(cluster, editor_client, HOLDERS).preflight(ns).extra["holdOwnership"]
    assert not other.supported and "alice" in other.reason and "refuse" in other.reason
