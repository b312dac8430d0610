"""Every install variant (the base, and the base with each component) as kustomize renders
it: the objects agree with each other, the enforcer's Pod has no token unless a component
needs one, the roles cover what the supervisor and operators do on the real apiserver,
and the real apiserver accepts every rendered object with a strict server-side dry run.

Rendering uses the real kustomize v5.5.0 (tests/support/kustomize.py, built by
tests/support/tool_binaries.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.adapter import Adapter, CallMeta, Ref
from holdwarden.adapter import kube as adapter_kube
from holdwarden.adapter.errors import NotFound
from holdwarden.config import Config
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from tests.support.kustomize import generated_as, render
from tests.support.rbac_helpers import may, wait_allowed

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"
# The verb the adapter writes with (merge patch since adapter/patches.py, PUT before it);
# the roles grant both.
WRITE_VERB: str = getattr(adapter_kube, "WRITE_VERB", "update")
MONITORING_CRDS = Path(__file__).resolve().parent / "monitoring" / "crds.yaml"

# Variant name -> components added to the base (as an overlay would).
VARIANTS: dict[str, list[Path]] = {
    "base": [],
    "monitoring": [MANIFESTS / "monitoring"],
    "readmission": [MANIFESTS / "readmission"],
    "sidecar": [MANIFESTS / "sidecar", MANIFESTS / "provided"],
    "defence-in-depth": [MANIFESTS / "defence-in-depth"],
    "provided": [MANIFESTS / "provided"],
    # (cert-manager's objects need its CRDs, which are not here: its render is checked
    # below and in tests/controlplane/test_manifests_selfmanaged.py.)
    "provided-defence-in-depth": [MANIFESTS / "provided", MANIFESTS / "defence-in-depth"],
    "everything": [MANIFESTS / "monitoring", MANIFESTS / "readmission"],
}


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one ``kind`` named ``name`` (a generated ConfigMap's hash suffix aside)."""
    (found,) = [o for o in objs if o["kind"] == kind and generated_as(o, name)]
    return found


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_renders_unique_labelled_objects(variant: str) -> None:
    objs = render(MANIFESTS, VARIANTS[variant])
    keys = [_key(o) for o in objs]
    assert len(keys) == len(set(keys)), keys
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "holdwarden", _key(obj)
        pod = (obj.get("spec") or {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if container["name"] == "enforcer":
                assert container["image"] == "holdwarden:0.1.0"


def test_the_enforcer_is_bound_only_to_its_certificates_rights() -> None:
    base = render(MANIFESTS)
    account = _find(base, "ServiceAccount", "holdwarden")
    assert account["automountServiceAccountToken"] is False
    pod = _find(base, "Deployment", "holdwarden")["spec"]["template"]["spec"]
    # Self-managed certificates (the default) call the API: the Pod has its token.
    assert pod["automountServiceAccountToken"] is True
    assert (
        pod["priorityClassName"]
        == _find(base, "PriorityClass", "holdwarden-critical")["metadata"]["name"]
    )
    # The base binds the enforcer's account to the certificates' roles only
    # (tests/controlplane/test_manifests_selfmanaged.py checks each rule).
    bound = {
        o["roleRef"]["name"] for o in base if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    assert bound == {"holdwarden-certificates", "holdwarden-enforcer-probe"}


def test_readmission_runs_the_gate_in_its_own_pods_with_the_token_and_its_role() -> None:
    objs = render(MANIFESTS, VARIANTS["readmission"])
    pod = _find(objs, "Deployment", "holdwarden-readmission")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["containers"][0]["args"][0] == "gate"
    binding = _find(objs, "ClusterRoleBinding", "holdwarden-readmission")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    # The enforcer's account is not the gate's.
    enforcer = _find(objs, "Deployment", "holdwarden")["spec"]["template"]["spec"]
    assert enforcer["serviceAccountName"] != pod["serviceAccountName"]


def test_sidecar_serves_the_webhook_from_the_supervisors_pods() -> None:
    objs = render(MANIFESTS, VARIANTS["sidecar"])
    assert not [
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "holdwarden"
    ]
    deployment = _find(objs, "Deployment", "holdwarden-supervisor")
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for kind, path in (
        ("Service", ("spec", "selector")),
        ("PodDisruptionBudget", ("spec", "selector", "matchLabels")),
        ("NetworkPolicy", ("spec", "podSelector", "matchLabels")),
    ):
        selector: Any = _find(objs, kind, "holdwarden")
        for part in path:
            selector = selector[part]
        assert selector.items() <= labels.items(), kind
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"supervisor", "enforcer"}
    # The enforcer is the base's container with provided certificates, unchanged.
    base_pod = _find(render(MANIFESTS, [MANIFESTS / "provided"]), "Deployment", "holdwarden")[
        "spec"
    ]["template"]["spec"]
    assert containers["enforcer"] == base_pod["containers"][0]
    assert {v["name"]: v for v in pod["volumes"]}.items() >= {
        v["name"]: v for v in base_pod["volumes"]
    }.items()
    # The token reaches the supervisor container only.
    assert pod["automountServiceAccountToken"] is False
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token_path in {m["mountPath"] for m in containers["supervisor"]["volumeMounts"]}
    assert token_path not in {m["mountPath"] for m in containers["enforcer"]["volumeMounts"]}
    service = _find(objs, "Service", "holdwarden")
    webhook = _find(objs, "ValidatingWebhookConfiguration", "holdwarden-enforcer")
    assert webhook["webhooks"][0]["clientConfig"]["service"]["name"] == service["metadata"]["name"]


def test_cert_manager_makes_the_secret_the_pod_mounts_for_the_names_the_apiserver_dials() -> None:
    """manifests/cert-manager, rendered (cert-manager itself is not run here: no binary and
    no CRDs of it in this repository; docs/how-to/certificates.md says so). Its objects must agree
    with the base: the serving Certificate writes the Secret the Deployment mounts, for the
    Service's names, signed by a CA Issuer whose CA cainjector injects into the webhook."""
    base = render(MANIFESTS, [MANIFESTS / "provided"])
    objs = render(MANIFESTS, [MANIFESTS / "cert-manager"])
    issuers = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Issuer"}
    certificates = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    assert set(issuers) == {"holdwarden-selfsigned", "holdwarden-ca"}
    assert set(certificates) == {"holdwarden-ca", "holdwarden-serving"}
    for obj in (*issuers.values(), *certificates.values()):
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == NAMESPACE
    ca, serving = certificates["holdwarden-ca"]["spec"], certificates["holdwarden-serving"]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"] == {
        "kind": "Issuer",
        "name": "holdwarden-selfsigned",
    }
    assert issuers["holdwarden-selfsigned"]["spec"] == {"selfSigned": {}}
    assert issuers["holdwarden-ca"]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    assert serving["issuerRef"] == {"kind": "Issuer", "name": "holdwarden-ca"}
    assert "server auth" in serving["usages"] and not serving.get("isCA", False)
    # The Secret the enforcer's Pod mounts (and hot-reloads tls.crt/tls.key from).
    pod = _find(base, "Deployment", "holdwarden")["spec"]["template"]["spec"]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert serving["secretName"] == tls["secret"]["secretName"]
    # The names the apiserver dials for clientConfig.service.
    webhook = _find(objs, "ValidatingWebhookConfiguration", "holdwarden-enforcer")
    service = webhook["webhooks"][0]["clientConfig"]["service"]
    name, namespace = service["name"], service["namespace"]
    assert {name, f"{name}.{namespace}", f"{name}.{namespace}.svc"} <= set(serving["dnsNames"])
    # cainjector keeps caBundle equal to the serving Certificate's ca.crt.
    annotations = webhook["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/holdwarden-serving"
    # Renewal happens well before expiry, and the leaf never outlives the CA.
    hours = {k: int(v.rstrip("h")) for k, v in serving.items() if k in ("duration", "renewBefore")}
    assert hours["renewBefore"] < hours["duration"] <= int(ca["duration"].rstrip("h"))
    # Nothing else in the base changes.
    others = [o for o in objs if o["kind"] not in ("Issuer", "Certificate")]
    stripped = [o for o in others if o["kind"] == "ValidatingWebhookConfiguration"]
    for hook in stripped:
        hook["metadata"]["annotations"].pop("cert-manager.io/inject-ca-from")
    assert sorted(map(_key, others)) == sorted(map(_key, base))
    assert _find(others, "ValidatingWebhookConfiguration", "holdwarden-enforcer") == _find(
        base, "ValidatingWebhookConfiguration", "holdwarden-enforcer"
    )


def test_monitoring_scrapes_the_service_and_alerts_on_the_metrics_we_export() -> None:
    from holdwarden.webhook import metrics

    objs = render(MANIFESTS, VARIANTS["monitoring"])
    monitor = _find(objs, "ServiceMonitor", "holdwarden")
    service = _find(objs, "Service", "holdwarden")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    rules = [r for g in _find(objs, "PrometheusRule", "holdwarden")["spec"]["groups"]
             for r in g["rules"]]  # fmt: skip
    by_alert = {r["alert"]: r["expr"] for r in rules}
    assert metrics.CERT_EXPIRY in by_alert["HoldwardenCertificateExpiresSoon"]
    assert "14 * 24 * 3600" in next(
        r["expr"] for r in rules if r["labels"]["severity"] == "warning"
    )
    assert f"{metrics.REVIEWS}_total" in by_alert["HoldwardenRefusalRateHigh"]
    assert 'decision="denied"' in by_alert["HoldwardenRefusalRateHigh"]
    assert "up{" in by_alert["HoldwardenWebhookUnavailable"]
    webhook = _find(objs, "ValidatingWebhookConfiguration", "holdwarden-enforcer")
    assert webhook["webhooks"][0]["name"] in by_alert["HoldwardenWebhookCallsFailing"]


# -- the real apiserver ------------------------------------------------------------------


def _call(
    cluster: LocalCluster, api: k8s.ApiClient, method: str, path: str, body: Any = None
) -> tuple[int, Any, str]:
    try:
        response = api.call_api(
            method,
            f"{cluster.server_url}{path}",
            # call_api does not add the client's default headers (impersonation) itself.
            header_params={
                **api.default_headers,
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
            body=body,
        )
    except ApiException as exc:
        return exc.status, exc.body, ""
    data = response.read()  # type: ignore[no-untyped-call]
    warning = response.headers.get("Warning", "")
    return response.status, json.loads(data) if data else None, warning


def _collection(
    cluster: LocalCluster, api: k8s.ApiClient, obj: dict[str, Any], cache: dict[str, Any]
) -> str:
    """The object's collection URL, from the apiserver's discovery (CRDs included)."""
    api_version: str = obj["apiVersion"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if base not in cache:
        status, listing, _ = _call(cluster, api, "GET", base)
        assert status == 200, f"discovery of {base}: {status}"
        cache[base] = listing
    (resource,) = [
        r for r in cache[base]["resources"] if r["kind"] == obj["kind"] and "/" not in r["name"]
    ]
    if resource["namespaced"]:
        return f"{base}/namespaces/{obj['metadata']['namespace']}/{resource['name']}"
    return f"{base}/{resource['name']}"


def install_monitoring_crds(cluster: LocalCluster, api: k8s.ApiClient) -> None:
    """The minimal monitoring.coreos.com CRDs (tests/controlplane/monitoring/crds.yaml),
    established."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for crd in yaml.safe_load_all(MONITORING_CRDS.read_text()):
        status, body, _ = _call(cluster, api, "POST", crds, crd)
        assert status in (201, 409), body
        deadline = time.monotonic() + 30
        while True:
            _, got, _ = _call(cluster, api, "GET", f"{crds}/{crd['metadata']['name']}")
            conditions = {
                c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []
            }
            if conditions.get("Established") == "True":
                break
            assert time.monotonic() < deadline, f"{crd['metadata']['name']} not established"
            time.sleep(0.2)
    # Discovery (which _collection reads) lags the Established condition a little.
    deadline = time.monotonic() + 30
    while _call(cluster, api, "GET", "/apis/monitoring.coreos.com/v1")[0] != 200:
        assert time.monotonic() < deadline, "monitoring.coreos.com/v1 not discoverable"
        time.sleep(0.2)


@pytest.mark.controlplane
def test_the_apiserver_accepts_every_rendered_object_strictly(
    cluster: LocalCluster, admin_client: k8s.ApiClient
) -> None:
    """fieldValidation=Strict: unknown or duplicate fields and bad values fail, and a Pod
    template that breaks the namespace's restricted Pod Security comes back as a warning."""
    install_monitoring_crds(cluster, admin_client)
    base = render(MANIFESTS)
    namespace = _find(base, "Namespace", NAMESPACE)
    status, body, _ = _call(cluster, admin_client, "POST", "/api/v1/namespaces", namespace)
    if status == 409:  # made by another test: give it our labels (Pod Security)
        k8s.CoreV1Api(admin_client).patch_namespace(
            NAMESPACE, {"metadata": {"labels": namespace["metadata"]["labels"]}}
        )
    else:
        assert status == 201, body
    # Kueue's namespace, for the readmission component's MultiKueue Role (it exists
    # wherever the gate runs; other tests may have made it here).
    kueue_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}
    status, body, _ = _call(cluster, admin_client, "POST", "/api/v1/namespaces", kueue_ns)
    assert status in (201, 409), body
    cache: dict[str, Any] = {}
    seen: set[str] = set()
    for variant, components in sorted(VARIANTS.items()):
        for obj in render(MANIFESTS, components):
            text = json.dumps(obj, sort_keys=True)
            if text in seen or obj["kind"] == "Namespace":
                continue
            seen.add(text)
            path = _collection(cluster, admin_client, obj, cache)
            status, body, warning = _call(
                cluster, admin_client, "POST", f"{path}?dryRun=All&fieldValidation=Strict", obj
            )
            where = f"{variant}: {_key(obj)}"
            assert status == 201, f"{where}: {status} {str(body)[:800]}"
            assert warning == "", f"{where}: {warning}"
    assert len(seen) > len(base)


# -- the roles do what they say, on the real apiserver ---------------------------------

_RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def roles(cluster: LocalCluster, admin_client: k8s.ApiClient) -> Iterator[None]:
    """The rendered ClusterRoles, created for real (not a dry run) for bindings to use,
    and deleted afterwards."""
    path = f"{_RBAC}/clusterroles"
    for obj in render(MANIFESTS):
        if obj["kind"] != "ClusterRole":
            continue
        status, body, _ = _call(cluster, admin_client, "POST", path, obj)
        if status == 409:  # made by an earlier test: make it ours again
            one = f"{path}/{obj['metadata']['name']}"
            _, old, _ = _call(cluster, admin_client, "GET", one)
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            status, body, _ = _call(cluster, admin_client, "PUT", one, obj)
            assert status == 200, body
        else:
            assert status == 201, body
    yield
    # Gone again, so that other tests' dry-run creates of the same roles do not meet a 409.
    for obj in render(MANIFESTS):
        if obj["kind"] == "ClusterRole":
            _call(cluster, admin_client, "DELETE", f"{path}/{obj['metadata']['name']}")


def _bind(
    cluster: LocalCluster, admin: k8s.ApiClient, user: str, role: str, namespace: str | None
) -> None:
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding" if namespace is None else "RoleBinding",
        "metadata": {"name": f"{role}-{uuid.uuid4().hex[:6]}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    path = (
        f"{_RBAC}/clusterrolebindings"
        if namespace is None
        else f"{_RBAC}/namespaces/{namespace}/rolebindings"
    )
    status, answer, _ = _call(cluster, admin, "POST", path, body)
    assert status == 201, answer


@pytest.mark.controlplane
@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_supervisor_roles_are_enough_for_preflight(
    cluster: LocalCluster, admin_client: k8s.ApiClient, namespace: str, roles: None, mode: str
) -> None:
    user = f"test-supervisor-{uuid.uuid4().hex[:8]}"
    _bind(cluster, admin_client, user, "holdwarden-supervisor", namespace)
    _bind(cluster, admin_client, user, "holdwarden-supervisor-cluster", None)
    api = cluster.api_client(user)
    try:
        wait_allowed(api, WRITE_VERB, "workloads.kueue.x-k8s.io", namespace)
        # The cluster-wide binding: preflight lists ClusterTrainingRuntimes and follows
        # LocalQueues to their ClusterQueues.
        wait_allowed(api, "list", "clustertrainingruntimes.trainer.kubeflow.org")
        wait_allowed(api, "get", "clusterqueues.kueue.x-k8s.io")
        adapter = Adapter(Config.from_dict({"mode": mode}), api)
        try:
            result = adapter.preflight(namespace)
        finally:
            adapter.close()
    finally:
        api.close()  # type: ignore[no-untyped-call]
    caps = result.capabilities()
    for name in ("holdRoundTrip", "updateWorkloads", "updateTrainJobs", "listPods"):
        assert caps[name].supported, f"{name}: {caps[name].reason}"
    assert result.hold_supported
    # The gate probe may find no gated queue here, but never for lack of a right.
    for cap in caps.values():
        assert "forbidden" not in cap.reason.lower(), cap.reason
        assert "could not" not in cap.reason, cap.reason


@pytest.mark.controlplane
def test_supervisor_role_lets_a_conflicted_call_retry_from_a_watch(
    cluster: LocalCluster, admin_client: k8s.ApiClient, namespace: str, roles: None
) -> None:
    """The shipped role grants what a retry after a conflict reads with: the call's
    retries come from its watch (no GET after it), and the hold lands."""
    user = f"test-supervisor-{uuid.uuid4().hex[:8]}"
    _bind(cluster, admin_client, user, "holdwarden-supervisor", namespace)
    _bind(cluster, admin_client, user, "holdwarden-supervisor-cluster", None)
    custom: Any = k8s.CustomObjectsApi(admin_client)
    coords = ("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")
    custom.create_namespaced_custom_object(*coords, trainjob_body("job", suspend=True))

    def touch(req: adapter_kube.Request) -> None:
        if req.verb == "update" and not touched:  # between the first read and its write
            touched.append(1)
            custom.patch_namespaced_custom_object(
                *coords, "job", {"metadata": {"labels": {"touched": "yes"}}}
            )

    touched: list[int] = []
    api = cluster.api_client(user)
    try:
        wait_allowed(api, "watch", "trainjobs.trainer.kubeflow.org", namespace)
        adapter = Adapter(
            Config.from_dict({"mode": "plain"}), api, lazy_preflight="access", before_request=touch
        )
        try:
            adapter.hold(
                Ref(namespace, "job"), CallMeta(datetime.now(UTC) + timedelta(seconds=20), 1), "r"
            )
        finally:
            adapter.close()
    finally:
        api.close()  # type: ignore[no-untyped-call]
    verbs = [r.verb for r in adapter.request_log if r.resource == "trainjobs"]
    assert verbs[-3:] == ["update", "watch", "update"], verbs
    workload_api = cluster.api_client(user)
    try:
        assert may(workload_api, "watch", "workloads.kueue.x-k8s.io", namespace)
    finally:
        workload_api.close()  # type: ignore[no-untyped-call]
    held = custom.get_namespaced_custom_object(*coords, "job")
    assert held["spec"]["suspend"] is True and held["metadata"]["labels"]["touched"] == "yes"


@pytest.mark.controlplane
def test_operator_roles_view_and_hold(
    cluster: LocalCluster, admin_client: k8s.ApiClient, namespace: str, roles: None
) -> None:
    viewer, holder = (f"test-{k}-{uuid.uuid4().hex[:8]}" for k in ("viewer", "holder"))
    _bind(cluster, admin_client, viewer, "holdwarden-operator-view", namespace)
    _bind(cluster, admin_client, holder, "holdwarden-operator-hold", namespace)
    ref = Ref(namespace, "absent")
    meta = CallMeta(datetime.now(UTC) + timedelta(seconds=20), 1)
    for user, may_hold in ((viewer, False), (holder, True)):
        api = cluster.api_client(user)
        try:
            wait_allowed(api, "get", "trainjobs.trainer.kubeflow.org", namespace)
            # Operators never create (preflight's dry runs are the supervisor's).
            assert not may(api, "create", "trainjobs.trainer.kubeflow.org", namespace)
            for what in ("workloads.kueue.x-k8s.io", "trainjobs.trainer.kubeflow.org"):
                assert may(api, WRITE_VERB, what, namespace) is may_hold, (user, what)
            adapter = Adapter(Config(), api, lazy_preflight="access")
            try:
                # status: the read is allowed, so a missing TrainJob is "not found".
                with pytest.raises(NotFound):
                    adapter.observe(ref)
                with pytest.raises(NotFound):  # hold's first read, before any write
                    adapter.hold(ref, meta, "test")
            finally:
                adapter.close()
        finally:
            api.close()  # type: ignore[no-untyped-call]
