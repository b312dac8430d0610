"""manifests/readmission: the optional gate's component is consistent, grants exactly what
the gate uses on the real control plane, and the apiserver accepts its objects strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from holdwarden.config import Config
from rig.localcluster import LocalCluster
from rig.localcluster.rbac import ENFORCER_IDENTITY, IDENTITY_RBAC

COMPONENT = Path(__file__).resolve().parent.parent / "manifests" / "readmission"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d is not None]


def test_component_lists_its_files_and_enables_the_gate() -> None:
    kustomization = _docs("kustomization.yaml")[0]
    assert kustomization["kind"] == "Component"
    assert set(kustomization["resources"]) == {"rbac.yaml", "admissioncheck.yaml"}
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
    tested = next(i for i in IDENTITY_RBAC if i.user == ENFORCER_IDENTITY)
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
    for name in ("rbac.yaml", "admissioncheck.yaml"):
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
