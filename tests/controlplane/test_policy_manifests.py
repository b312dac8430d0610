"""manifests/policy, policy-only and defence-in-depth: generated from webhook/policy.py for the
shipped configuration, accepted by the real kube-apiserver, and built by kustomize."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from holdwarden.config import Config
from holdwarden.webhook.policy import owner_only_manifest, rules_manifest
from rig.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
RULES_FILE = MANIFESTS / "policy" / "policy.yaml"
OWNER_FILE = MANIFESTS / "policy" / "owner-only" / "policy.yaml"


def shipped_config() -> Config:
    return Config.from_dict(yaml.safe_load((MANIFESTS / "config" / "config.yaml").read_text()))


def test_the_shipped_policies_are_the_rendered_ones_for_the_shipped_config() -> None:
    config = shipped_config()
    assert RULES_FILE.read_text() == rules_manifest(
        config.annotation_prefix, config.kueue_identities
    ), "regenerate: python -m holdwarden.webhook.policy > manifests/policy/policy.yaml"
    assert OWNER_FILE.read_text() == owner_only_manifest(config.annotation_prefix), (
        "regenerate: python -m holdwarden.webhook.policy --owner-only > "
        "manifests/policy/owner-only/policy.yaml"
    )


def test_the_binding_judges_the_namespaces_the_webhook_judges() -> None:
    webhook = yaml.safe_load((MANIFESTS / "webhook.yaml").read_text())["webhooks"][0]
    for path in (RULES_FILE, OWNER_FILE):
        policy, binding = list(yaml.safe_load_all(path.read_text()))
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        assert binding["spec"]["validationActions"] == ["Deny"]
        if "namespaceSelector" in webhook:
            assert (
                binding["spec"]["matchResources"]["namespaceSelector"]
                == (webhook["namespaceSelector"])
            )
        assert policy["spec"]["failurePolicy"] == "Fail"


@pytest.mark.controlplane
def test_the_apiserver_accepts_the_shipped_policies(cluster: LocalCluster) -> None:
    with cluster.api_client() as admin:
        api = k8s.AdmissionregistrationV1Api(admin)
        for path in (RULES_FILE, OWNER_FILE):
            policy, binding = list(yaml.safe_load_all(path.read_text()))
            api.create_validating_admission_policy(policy, dry_run="All", field_validation="Strict")
            api.create_validating_admission_policy_binding(
                binding, dry_run="All", field_validation="Strict"
            )


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (kustomize) is not installed here")
    built = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def test_policy_only_installs_the_policy_and_nothing_else() -> None:
    kinds = sorted(doc["kind"] for doc in _kustomize(MANIFESTS / "policy-only"))
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_defence_in_depth_puts_the_policy_beside_a_webhook_that_ignores_failures(
    tmp_path: Path,
) -> None:
    # An overlay that uses the components as docs/explanation/policy.md says (kustomize refuses a
    # component that includes its own parent, so the overlay lives next to a copy).
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../manifests"],
                "components": ["../manifests/defence-in-depth", "../manifests/policy/owner-only"],
            }
        )
    )
    docs = _kustomize(overlay)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    # The hold rules, and the base's guard on the certificates' probe Role.
    assert {p["metadata"]["name"] for p in by_kind["ValidatingAdmissionPolicy"]} == {
        "holdwarden-hold-rules",
        "holdwarden-hold-owner-only",
        "holdwarden-enforcer-probe-dry-run-only",
    }
    assert len(by_kind["ValidatingAdmissionPolicyBinding"]) == 3
    (hook,) = by_kind["ValidatingWebhookConfiguration"]
    assert hook["webhooks"][0]["failurePolicy"] == "Ignore"
    assert "Deployment" in by_kind
