"""manifests/ and Dockerfile: they parse, agree with each other and with the contract, and
the real kube-apiserver accepts every object (server-side dry run, strict field validation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.config import CertificatesConfig, Config, split_address
from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION, TRAINJOB, WORKLOAD
from holdwarden.webhook.match_conditions import WEBHOOK_TIMEOUT_SECONDS
from rig.localcluster import LocalCluster
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


DOCS = _documents()


def one(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in DOCS if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_kustomization_lists_exactly_the_manifest_files() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == on_disk
    # No namespace transformer: every object names its namespace itself.
    assert "namespace" not in kustomization


def test_every_object_is_named_and_namespaced_objects_are_in_holdwarden_system() -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding",
                      "ValidatingWebhookConfiguration", "PriorityClass",
                      "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    kinds = sorted(doc["kind"] for _, doc in DOCS)
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount",
            # Roles for the supervisor (2) and operators (2), bound by the user, and the
            # enforcer's Events sink role, bound only by manifests/audit-events.
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            # Self-managed certificates (certificates.yaml): the Secret and Lease, the one
            # webhook configuration, and the verification probe in `default`.
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            # ... and that probe's Role taken back for everything but dry runs.
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "ValidatingWebhookConfiguration",
            "NetworkPolicy",
            "PriorityClass",
        ]
    )
    probe_namespace = CertificatesConfig().probe_namespace
    for name, doc in DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"], name
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], name
        elif doc["metadata"]["name"] == "holdwarden-enforcer-probe":
            assert doc["metadata"]["namespace"] == probe_namespace, name
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, name
    assert one("Namespace")["metadata"]["name"] == NAMESPACE


def test_webhook_configuration_matches_the_contract() -> None:
    vwc = one("ValidatingWebhookConfiguration")
    assert vwc["metadata"]["name"] == "holdwarden-enforcer"
    (hook,) = vwc["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    # Ignore until the self-managed leader verified the enforcer; then the annotation's.
    assert hook["failurePolicy"] == "Ignore"
    assert vwc["metadata"]["annotations"][FAILURE_POLICY_ANNOTATION] == "Fail"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["timeoutSeconds"] == WEBHOOK_TIMEOUT_SECONDS == 10
    assert "caBundle" not in hook["clientConfig"]  # injected by the self-managed leader
    service = one("Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NAMESPACE,
        "path": "/validate",
        "port": 443,
    }
    rules = {
        (rule["apiGroups"][0], rule["apiVersions"][0], rule["resources"][0]): rule
        for rule in hook["rules"]
    }
    assert set(rules) == {
        (TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural),
        (WORKLOAD.group, WORKLOAD.version, WORKLOAD.plural),
    }
    for rule in hook["rules"]:
        assert len(rule["apiGroups"]) == len(rule["apiVersions"]) == len(rule["resources"]) == 1
        # CREATE and UPDATE (docs/reference/rules.md); DELETE for Workloads only
        # (held-workload-kept);
        # never the status subresource.
        expected = (
            ["CREATE", "UPDATE", "DELETE"]
            if rule["resources"] == ["workloads"]
            else [
                "CREATE",
                "UPDATE",
            ]
        )
        assert rule["operations"] == expected
        assert all("/" not in r and "*" not in r for r in rule["resources"])
        assert rule["scope"] == "Namespaced"


def _config() -> Config:
    return Config.from_dict(yaml.safe_load((MANIFESTS / "config" / "config.yaml").read_text()))


def test_configmap_config_loads_and_agrees_with_the_deployment() -> None:
    config = _config()
    # Generated from config/config.yaml with kustomize's content hash in its name, which
    # the Deployment's volume names too: a changed configuration rolls the Pods.
    (configmap,) = [o for o in render(MANIFESTS) if o["kind"] == "ConfigMap"]
    assert re.fullmatch(r"holdwarden-config-[a-z0-9]{10}", configmap["metadata"]["name"])
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == yaml.safe_load(
        (MANIFESTS / "config" / "config.yaml").read_text()
    )
    assert configmap["metadata"]["labels"]["app.kubernetes.io/component"] == "enforcer"
    (rendered,) = [o for o in render(MANIFESTS) if o["kind"] == "Deployment"]
    rendered_volumes = {v["name"]: v for v in rendered["spec"]["template"]["spec"]["volumes"]}
    assert rendered_volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert config.mode == "kueue"
    assert config.kueue_identities == (
        "system:serviceaccount:kueue-system:kueue-controller-manager",
    )
    pod = one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    # The config file the server is told to read is the ConfigMap's config.yaml.
    config_path = container["args"][container["args"].index("--config") + 1]
    assert mounts["config"]["mountPath"] == config_path
    assert mounts["config"]["subPath"] == "config.yaml"
    assert volumes["config"]["configMap"]["name"] == "holdwarden-config"

    # Self-managed: the certificate comes from the API, so no certificate volume
    # (manifests/provided mounts one: tests/controlplane/test_manifests_selfmanaged.py).
    assert "tls" not in mounts and "tls" not in volumes
    assert "--certificates=self-managed" in container["args"]

    # The audit log is on a writable volume (the root filesystem is read-only).
    assert Path(mounts["audit"]["mountPath"]) == config.webhook.audit_log.parent
    assert "emptyDir" in volumes["audit"]

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["https"] == split_address(config.webhook.listen_address)[1] == 9443
    assert ports["metrics"] == split_address(config.webhook.metrics_address)[1] == 9090


def test_deployment_is_hardened_and_probed() -> None:
    deployment = one("Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # A starting Pod runs only its startup probe (readiness's check, a few minutes' budget),
    # so it is not reported failing readiness or liveness (tests/pods checks the Events).
    startup = container["startupProbe"]
    assert startup["httpGet"] == container["readinessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    assert "initialDelaySeconds" not in container["livenessProbe"]
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    assert container["args"] == [
        "serve",
        "--config",
        "/etc/holdwarden/config.yaml",
        "--certificates=self-managed",
    ]


def test_service_pdb_and_rbac_point_at_the_right_things() -> None:
    deployment = one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"https": (443, "https"), "metrics": (9090, "metrics")}
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] == 1

    # The enforcer's Pod has its token for self-managed certificates (the account itself
    # mounts none by default); the only bindings are the certificates' own.
    account = one("ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    bindings = {
        (doc["kind"], doc["metadata"]["name"])
        for _, doc in DOCS
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    assert bindings == {
        ("RoleBinding", "holdwarden-certificates"),
        ("ClusterRoleBinding", "holdwarden-certificates"),
        ("RoleBinding", "holdwarden-enforcer-probe"),
    }
    roles = {doc["metadata"]["name"]: doc for _, doc in DOCS if doc["kind"] == "ClusterRole"}
    assert set(roles) == {
        "holdwarden-supervisor",
        "holdwarden-supervisor-cluster",
        "holdwarden-operator-view",
        "holdwarden-operator-hold",
        "holdwarden-audit-events",
        "holdwarden-certificates",
    }
    # Operators' roles never create (preflight's dry runs are the supervisor's) and the
    # view role never writes.
    for name in ("holdwarden-operator-view", "holdwarden-operator-hold"):
        verbs = {verb for rule in roles[name]["rules"] for verb in rule["verbs"]}
        assert "create" not in verbs and "delete" not in verbs and "*" not in verbs, name
    view = {v for rule in roles["holdwarden-operator-view"]["rules"] for v in rule["verbs"]}
    assert view <= {"get", "list", "watch"}
    # The priority class the Pods name is the one shipped.
    assert (
        deployment["spec"]["template"]["spec"]["priorityClassName"]
        == one("PriorityClass")["metadata"]["name"]
    )


def test_dockerfile_runs_the_manifests_command_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages and all(s.startswith("python:3.11-slim") for s in stages)
    assert len(stages) >= 2  # multi-stage
    assert re.search(r"^USER 65532:65532$", text, re.MULTILINE)
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", text, re.MULTILINE)
    cmd = re.search(r"^CMD (.+)$", text, re.MULTILINE)
    assert entrypoint and json.loads(entrypoint.group(1)) == ["holdwarden"]
    # The manifests add only the certificate mode to the image's command.
    assert (
        cmd
        and [*json.loads(cmd.group(1)), "--certificates=self-managed"]
        == (one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    pod = one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532


# -- the real apiserver ------------------------------------------------------------

_PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    ),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
}


def _post(
    cluster: LocalCluster, api: k8s.ApiClient, path: str, body: dict[str, Any], query: str
) -> tuple[int, bytes, list[str]]:
    response = api.call_api(
        "POST",
        f"{cluster.server_url}{path}?{query}",
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
    )
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    warning = response.headers.get("Warning", "")
    warnings = [warning] if warning else []
    return response.status, data, warnings


@pytest.mark.controlplane
def test_the_apiserver_accepts_every_object_strictly(
    cluster: LocalCluster, admin_client: k8s.ApiClient
) -> None:
    """Server-side dry run with fieldValidation=Strict: unknown or duplicate fields, bad
    values and restricted-Pod-Security violations (a warning on the Deployment) all fail.
    """
    namespace = one("Namespace")
    status, data, _ = _post(cluster, admin_client, _PATHS["Namespace"], namespace, "")
    if status == 409:  # another test made it already; give it our labels
        k8s.CoreV1Api(admin_client).patch_namespace(
            NAMESPACE, {"metadata": {"labels": namespace["metadata"]["labels"]}}
        )
    else:
        assert status == 201, data
    for name, doc in DOCS:
        path = _PATHS[doc["kind"]].format(ns=doc["metadata"].get("namespace"))
        try:
            status, data, warnings = _post(
                cluster, admin_client, path, doc, "dryRun=All&fieldValidation=Strict"
            )
        except ApiException as exc:
            raise AssertionError(f"{name} {doc['kind']}: {exc.status} {exc.body}") from None
        if status == 409 and doc["kind"] == "Namespace":
            continue
        assert status == 201, f"{name} {doc['kind']}: {status} {data[:1000]!r}"
        assert warnings == [], f"{name} {doc['kind']}: {warnings}"


PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _probes(node: Any, where: str) -> list[tuple[str, Any]]:
    """Every startup, readiness and liveness probe under ``node``, with the container and
    the kind of probe."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for kind in PROBES:
            if kind in node:
                found.append((f"{where}:{node.get('name', '?')}:{kind}", node[kind]))
        for value in node.values():
            found += _probes(value, where)
    elif isinstance(node, list):
        for item in node:
            found += _probes(item, where)
    return found


def test_every_probe_waits_5_s_for_an_answer() -> None:
    """A probe must catch a hung process, not a busy node. With the default 1 s timeout
    the gate's Pods were restarted (liveness) and a serving enforcer Pod was taken out of
    the Service for 10 s mid-rollout (readiness), on a CPU-starved node (a loaded run of
    tests/pods); every shipped probe waits 5 s."""
    probes = [
        probe
        for path in sorted(MANIFESTS.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        for probe in _probes(doc, str(path.relative_to(ROOT)))
    ]
    # enforcer, gate, sidecar, durable-audit: three probes each
    assert len(probes) >= 12, probes
    slow = [(where, p) for where, p in probes if p.get("timeoutSeconds", 1) < 5]
    assert not slow, slow
