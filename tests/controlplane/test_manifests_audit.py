"""The audit sinks in the shipped manifests: stdout by default with no token and nothing
bound; manifests/audit-events binds the Events role and mounts the token; manifests/
durable-audit turns the Deployment into a StatefulSet with a claim per replica and the file
sink on (with-events adds the Events sink to it). The sinks each variant runs with are read
through the real command line's parser and configuration loader, and the real apiserver
accepts every rendered object with a strict server-side dry run.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from holdwarden.cli import build_parser
from holdwarden.config import Config
from rig.localcluster import LocalCluster
from tests.controlplane.test_manifests_render import NAMESPACE, _call, _collection, _find
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
DURABLE = MANIFESTS / "durable-audit"

VARIANTS: dict[str, list[Path]] = {
    "audit-events": [MANIFESTS / "audit-events"],
    "durable-audit": [DURABLE],
    "durable-audit-events": [DURABLE, DURABLE / "with-events"],
    "audit-events-readmission": [MANIFESTS / "readmission", MANIFESTS / "audit-events"],
}


def _enforcer(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (workload,) = [
        o
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"] == "holdwarden"
    ]
    return workload


def sinks_of(objs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The sinks ``holdwarden serve`` runs with in this variant: its args through the real
    parser, over the ConfigMap's configuration (as serve_command combines them)."""
    pod = _enforcer(objs)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "enforcer"]
    args = build_parser().parse_args(container["args"])
    data = _find(objs, "ConfigMap", "holdwarden-config")["data"]["config.yaml"]
    configured = Config.from_dict(yaml.safe_load(data)).webhook.audit_sinks
    return tuple(dict.fromkeys(args.audit_sink)) if args.audit_sink else configured


def _bound_roles(objs: list[dict[str, Any]], account: str) -> set[str]:
    return {
        o["roleRef"]["name"]
        for o in objs
        if o["kind"] == "ClusterRoleBinding"
        and any(s["name"] == account and s["namespace"] == NAMESPACE for s in o["subjects"])
    }


@pytest.mark.parametrize(
    ("variant", "sinks", "token"),
    [
        # The base's Pod has its token for self-managed certificates; the sinks' own
        # rights are bound only with the events sink.
        pytest.param([], ("stdout",), True, id="base"),
        pytest.param([MANIFESTS / "provided"], ("stdout",), True, id="provided"),
        pytest.param([MANIFESTS / "readmission"], ("stdout",), True, id="readmission"),
        pytest.param([MANIFESTS / "sidecar"], ("stdout",), None, id="sidecar"),
        *(
            pytest.param(
                components,
                {
                    "audit-events": ("stdout", "events"),
                    "durable-audit": ("stdout", "file"),
                    "durable-audit-events": ("stdout", "file", "events"),
                    "audit-events-readmission": ("stdout", "events"),
                }[name],
                True,
                id=name,
            )
            for name, components in VARIANTS.items()
        ),
    ],
)
def test_each_variant_runs_the_sinks_it_says_and_mounts_a_token_only_for_the_api(
    variant: list[Path], sinks: tuple[str, ...], token: bool | None
) -> None:
    objs = render(MANIFESTS, variant)
    if token is None:  # the sidecar's enforcer: the base container in the supervisor's Pod
        supervisor = _find(objs, "Deployment", "holdwarden-supervisor")
        assert supervisor["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        return
    assert sinks_of(objs) == sinks
    pod = _enforcer(objs)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is token
    # The Events role is bound exactly when the events sink is on.
    has_binding = "holdwarden-audit-events" in _bound_roles(objs, pod["serviceAccountName"])
    assert has_binding is ("events" in sinks)
    role = _find(objs, "ClusterRole", "holdwarden-audit-events")
    assert role["rules"] == [
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
    ]


def test_operators_may_list_the_refusal_events() -> None:
    view = _find(render(MANIFESTS), "ClusterRole", "holdwarden-operator-view")
    assert {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]} in view[
        "rules"
    ]


def test_durable_audit_is_the_base_pod_with_a_claim_per_replica() -> None:
    base = render(MANIFESTS)
    objs = render(MANIFESTS, [DURABLE])
    assert not [o for o in objs if o["kind"] == "Deployment"]
    statefulset = _find(objs, "StatefulSet", "holdwarden")
    deployment = _find(base, "Deployment", "holdwarden")
    spec = statefulset["spec"]
    assert spec["replicas"] == deployment["spec"]["replicas"]
    assert spec["selector"] == deployment["spec"]["selector"]
    assert spec["serviceName"] == _find(objs, "Service", "holdwarden")["metadata"]["name"]
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The Pod is the base's, but for the audit volume (a claim, not an emptyDir) and the
    # sink flags.
    pod = copy.deepcopy(spec["template"])
    expected = copy.deepcopy(deployment["spec"]["template"])
    volumes = expected["spec"]["volumes"]
    (audit,) = [v for v in volumes if v["name"] == "audit"]
    assert "emptyDir" in audit
    volumes.remove(audit)
    container = pod["spec"]["containers"][0]
    assert container["args"][:4] == expected["spec"]["containers"][0]["args"]
    container["args"] = container["args"][:4]
    assert pod == expected
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert claim["metadata"]["name"] in mounts  # the claim is what the audit mount mounts
    config = Config.from_dict(
        yaml.safe_load(_find(objs, "ConfigMap", "holdwarden-config")["data"]["config.yaml"])
    )
    assert str(config.webhook.audit_log.parent) == mounts[claim["metadata"]["name"]]
    # The claim holds the log's whole disk budget.
    budget = config.webhook.audit_max_bytes * (config.webhook.audit_max_files + 1)
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi" and budget <= 2**30
    # The PodDisruptionBudget and the Service still select these Pods.
    labels = spec["template"]["metadata"]["labels"]
    pdb = _find(objs, "PodDisruptionBudget", "holdwarden")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _find(objs, "Service", "holdwarden")["spec"]["selector"].items() <= labels.items()


@pytest.mark.controlplane
def test_the_apiserver_accepts_the_audit_variants_strictly(
    cluster: LocalCluster, admin_client: k8s.ApiClient
) -> None:
    """fieldValidation=Strict server-side dry run of every object these variants add or
    change; a Pod template that breaks restricted Pod Security comes back as a warning."""
    base = render(MANIFESTS)
    namespace = _find(base, "Namespace", NAMESPACE)
    status, body, _ = _call(cluster, admin_client, "POST", "/api/v1/namespaces", namespace)
    if status == 409:
        k8s.CoreV1Api(admin_client).patch_namespace(
            NAMESPACE, {"metadata": {"labels": namespace["metadata"]["labels"]}}
        )
    else:
        assert status == 201, body
    # Kueue's namespace, where the readmission component's MultiKueue Role lives (Kueue
    # makes it in a cluster that runs the gate; other tests may have made it here).
    status, body, _ = _call(
        cluster, admin_client, "POST", "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}},
    )  # fmt: skip
    assert status in (201, 409), body
    known = {json.dumps(o, sort_keys=True) for o in base}
    cache: dict[str, Any] = {}
    checked: set[tuple[str, str]] = set()
    for variant, components in sorted(VARIANTS.items()):
        for obj in render(MANIFESTS, components):
            text = json.dumps(obj, sort_keys=True)
            if obj["kind"] == "Namespace" or (text in known and obj["kind"] != "ClusterRole"):
                continue
            known.add(text)
            path = _collection(cluster, admin_client, obj, cache)
            status, body, warning = _call(
                cluster, admin_client, "POST", f"{path}?dryRun=All&fieldValidation=Strict", obj
            )
            where = f"{variant}: {obj['kind']}/{obj['metadata']['name']}"
            assert status == 201, f"{where}: {status} {str(body)[:800]}"
            assert warning == "", f"{where}: {warning}"
            checked.add((obj["kind"], obj["metadata"]["name"]))
    assert {
        ("StatefulSet", "holdwarden"),
        ("ClusterRoleBinding", "holdwarden-audit-events"),
        ("ClusterRole", "holdwarden-audit-events"),
        ("Deployment", "holdwarden"),
    } <= checked
