"""manifests/readmission: the optional gate's component is consistent, grants exactly what
the gate uses on the real control plane, and the apiserver accepts its objects strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from holdwarden.config import Config
from rig.localcluster import LocalCluster
from rig.localcluster.rbac import GATE_IDENTITY, IDENTITY_RBAC
from tests.support.kustomize import render, unhashed

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
COMPONENT = MANIFESTS / "readmission"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d is not None]


def test_component_lists_its_files_and_enables_the_gate() -> None:
    kustomization = _docs("kustomization.yaml")[0]
    assert kustomization["kind"] == "Component"
    assert set(kustomization["resources"]) == {
        "serviceaccount.yaml",
        "rbac.yaml",
        "deployment.yaml",
        "pdb.yaml",
        "service.yaml",
        "networkpolicy.yaml",
        "admissioncheck.yaml",
    }
    # The enforcer's Deployment is not patched: the gate is its own process.
    assert all(p.get("target", {}).get("kind") != "Deployment" for p in kustomization["patches"])
    patch = _docs("config-patch.yaml")[0]
    config = Config.from_dict(yaml.safe_load(patch["data"]["config.yaml"]))
    assert config.readmission.enabled is True
    check = _docs("admissioncheck.yaml")[0]
    assert check["spec"]["controllerName"] == config.readmission.controller_name


def test_role_grants_what_the_gate_is_tested_with() -> None:
    # The ClusterRole, and the Role for its Lease (narrowed to one name where RBAC can).
    roles = [d for d in _docs("rbac.yaml") if d["kind"] in ("ClusterRole", "Role")]
    granted = {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    lease_role = next(d for d in roles if d["kind"] == "Role")
    named = [r for r in lease_role["rules"] if r.get("resourceNames")]
    assert named and named[0]["resourceNames"] == [Config().readmission.lease_name]
    tested = next(i for i in IDENTITY_RBAC if i.user == GATE_IDENTITY)
    used = {
        (group, resource, verb)
        for rule in tested.rules
        for group in rule.api_groups
        for resource in rule.resources
        for verb in rule.verbs
    }
    assert granted == used


def test_apiserver_accepts_the_component_strictly(
    cluster: LocalCluster, admin_client: k8s.ApiClient
) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    paths = {
        "ClusterRole": f"{rbac}/clusterroles",
        "ClusterRoleBinding": f"{rbac}/clusterrolebindings",
        "Role": f"{rbac}/namespaces/{{ns}}/roles",
        "RoleBinding": f"{rbac}/namespaces/{{ns}}/rolebindings",
        "AdmissionCheck": "/apis/kueue.x-k8s.io/v1beta2/admissionchecks",
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "Service": "/api/v1/namespaces/{ns}/services",
        "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
        "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    }
    # The install namespace, for the Lease's Role, and Kueue's, for the MultiKueue Secrets'
    # (other tests may have made them).
    for namespace in ("holdwarden-system", "kueue-system"):
        try:
            k8s.CoreV1Api(admin_client).create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
            )
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    for name in _docs("kustomization.yaml")[0]["resources"]:
        for doc in _docs(name):
            path = paths[doc["kind"]].format(ns=doc["metadata"].get("namespace", ""))
            response = admin_client.call_api(
                "POST",
                f"{cluster.server_url}{path}?dryRun=All&fieldValidation=Strict",
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                body=doc,
            )
            data = response.read()  # type: ignore[no-untyped-call]
            assert response.status == 201, f"{name} {doc['kind']}: {data[:500]!r}"


def _rendered() -> dict[tuple[str, str], dict[str, Any]]:
    objs = render(MANIFESTS, [COMPONENT])
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_the_gate_is_its_own_deployment_with_the_enforcers_image_and_security() -> None:
    objs = _rendered()
    enforcer = objs[("Deployment", "holdwarden")]["spec"]["template"]["spec"]
    gate = objs[("Deployment", "holdwarden-readmission")]["spec"]["template"]["spec"]
    (server,) = enforcer["containers"]
    (container,) = gate["containers"]
    assert container["image"] == server["image"]
    assert container["args"][0] == "gate" and "serve" not in container["args"]
    assert container["securityContext"] == server["securityContext"]
    assert gate["securityContext"] == enforcer["securityContext"]
    assert gate["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert gate["serviceAccountName"] == "holdwarden-readmission"
    assert gate["automountServiceAccountToken"] is True
    # Probes and metrics on the port readmission.metricsAddress names.
    config_map = next(o for (kind, _), o in objs.items() if kind == "ConfigMap")
    config = Config.from_dict(yaml.safe_load(config_map["data"]["config.yaml"]))
    port = int(config.readmission.metrics_address.rpartition(":")[2])
    (metrics,) = container["ports"]
    assert metrics == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"),
                        ("livenessProbe", "/healthz")):  # fmt: skip
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    assert objs[("Service", "holdwarden-readmission")]["spec"]["ports"][0]["port"] == port
    selector = {
        "app.kubernetes.io/name": "holdwarden",
        "app.kubernetes.io/component": "readmission",
    }
    pdb = objs[("PodDisruptionBudget", "holdwarden-readmission")]["spec"]
    assert pdb["selector"]["matchLabels"] == selector and pdb["minAvailable"] == 1
    # Same config volume as the enforcer (the hash-suffixed ConfigMap: a change rolls both).
    assert gate["volumes"][0] == enforcer["volumes"][0]


def test_only_the_gates_account_is_bound_and_the_enforcer_is_untouched() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in unhashed(render(MANIFESTS, [COMPONENT]))}
    base = {(o["kind"], o["metadata"]["name"]): o for o in unhashed(render(MANIFESTS, []))}
    for (kind, name), obj in objs.items():
        if kind in ("RoleBinding", "ClusterRoleBinding") and "readmission" in name:
            assert [s["name"] for s in obj["subjects"]] == ["holdwarden-readmission"], name
    # The component changes nothing of the enforcer's objects (but the configuration's
    # hash: readmission.enabled is set in it).
    for key in (("Deployment", "holdwarden"), ("ServiceAccount", "holdwarden")):
        assert objs[key] == base[key], key
