"""Self-managed certificates, the base's default (manifests/certificates.yaml and the
Deployment's flag): the base agrees with the configuration defaults it relies on and
grants exactly what certs/selfmanaged.py and certs/enforcing.py use; manifests/provided
(and manifests/cert-manager, which includes it) turn it back into a mounted Secret and
remove exactly those rights. (The real apiserver's strict dry run of every rendered object
is in tests/controlplane/test_manifests_render.py; tests/controlplane/test_certs_selfmanaged.py
runs the enforcer under these rules, tests/controlplane/test_install_onestep.py the whole
base.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from holdwarden.config import CertificatesConfig, Config
from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION
from tests.support.kustomize import generated_as, render

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
PROVIDED = MANIFESTS / "provided"
CERT_MANAGER = MANIFESTS / "cert-manager"
CERTIFICATE_RBAC = {
    ("Role", "holdwarden-certificates"),
    ("RoleBinding", "holdwarden-certificates"),
    ("ClusterRole", "holdwarden-certificates"),
    ("ClusterRoleBinding", "holdwarden-certificates"),
    ("Role", "holdwarden-enforcer-probe"),
    ("RoleBinding", "holdwarden-enforcer-probe"),
    ("ValidatingAdmissionPolicy", "holdwarden-enforcer-probe-dry-run-only"),
    ("ValidatingAdmissionPolicyBinding", "holdwarden-enforcer-probe-dry-run-only"),
}


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and generated_as(o, name)]
    return found


def _keys(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


def test_provided_mounts_the_secret_and_drops_exactly_the_flag_and_the_rights() -> None:
    base_objs, objs = render(MANIFESTS), render(MANIFESTS, [PROVIDED])
    base = _find(base_objs, "Deployment", "holdwarden")["spec"]["template"]["spec"]
    pod = _find(objs, "Deployment", "holdwarden")["spec"]["template"]["spec"]
    assert base["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    (base_container,) = base["containers"]
    assert base_container["args"][3] == "--certificates=self-managed"
    assert container["args"] == base_container["args"][:3]
    # Exactly the certificate volume and its mount are added, nothing else.
    assert [v["name"] for v in pod["volumes"]] == ["config", "tls", "audit", "tmp"]
    assert [v["name"] for v in base["volumes"]] == ["config", "audit", "tmp"]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"] == {"secretName": "holdwarden-webhook-tls", "defaultMode": 0o440}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    config = Config.from_dict(
        yaml.safe_load(_find(objs, "ConfigMap", "holdwarden-config")["data"]["config.yaml"])
    )
    assert mount["mountPath"] == str(config.webhook.cert_dir) and "subPath" not in mount
    assert config.webhook.certificates.mode == "files"  # no flag: the file's mode
    assert _keys(base_objs) - _keys(objs) == CERTIFICATE_RBAC
    assert _keys(objs) <= _keys(base_objs)


def test_cert_manager_is_provided_plus_its_issuers_and_injection() -> None:
    provided, objs = render(MANIFESTS, [PROVIDED]), render(MANIFESTS, [CERT_MANAGER])
    assert _find(objs, "Deployment", "holdwarden") == _find(provided, "Deployment", "holdwarden")
    assert _keys(objs) - _keys(provided) == {
        ("Issuer", "holdwarden-selfsigned"),
        ("Issuer", "holdwarden-ca"),
        ("Certificate", "holdwarden-ca"),
        ("Certificate", "holdwarden-serving"),
    }
    annotations = _find(objs, "ValidatingWebhookConfiguration", "holdwarden-enforcer")["metadata"][
        "annotations"
    ]
    # The base's annotation is kept beside cainjector's.
    assert annotations == {
        "cert-manager.io/inject-ca-from": "holdwarden-system/holdwarden-serving",
        FAILURE_POLICY_ANNOTATION: "Fail",
    }


def test_the_webhook_starts_at_ignore_and_the_annotation_says_what_it_becomes() -> None:
    for components, wanted in (
        ([], "Fail"),
        ([PROVIDED], "Fail"),
        ([MANIFESTS / "defence-in-depth"], "Ignore"),
        ([MANIFESTS / "defence-in-depth", CERT_MANAGER], "Ignore"),
    ):
        hook = _find(
            render(MANIFESTS, components), "ValidatingWebhookConfiguration", "holdwarden-enforcer"
        )
        assert [w["failurePolicy"] for w in hook["webhooks"]] == ["Ignore"], components
        assert hook["metadata"]["annotations"][FAILURE_POLICY_ANNOTATION] == wanted, components


def test_the_defaults_name_what_the_base_grants_and_ships() -> None:
    objs = render(MANIFESTS)
    defaults = CertificatesConfig()
    deployment = _find(objs, "Deployment", "holdwarden")
    namespace = deployment["metadata"]["namespace"]
    # The ConfigMap's configuration with the flag: self-managed, with the defaults below.
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--certificates=self-managed" in args
    text = _find(objs, "ConfigMap", "holdwarden-config")["data"]["config.yaml"]
    config = Config.from_dict(yaml.safe_load(text))
    assert config.webhook.certificates == defaults  # the flag sets only the mode
    # namespace "" means the Pod's own: where the Role is.
    assert defaults.namespace == ""
    role = _find(objs, "Role", "holdwarden-certificates")
    assert role["metadata"]["namespace"] == namespace
    webhook = _find(objs, "ValidatingWebhookConfiguration", defaults.webhook_configuration)
    service = _find(objs, "Service", defaults.service)
    for hook in webhook["webhooks"]:
        assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
        assert hook["clientConfig"]["service"]["namespace"] == namespace
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ())), v)
        for r in role["rules"]
        for v in r["verbs"]
    }
    assert rules == {
        (("",), ("secrets",), (), "create"),
        (("",), ("secrets",), (defaults.secret_name,), "get"),
        (("",), ("secrets",), (defaults.secret_name,), "update"),
        (("coordination.k8s.io",), ("leases",), (), "create"),
        (("coordination.k8s.io",), ("leases",), (defaults.lease_name,), "get"),
        (("coordination.k8s.io",), ("leases",), (defaults.lease_name,), "update"),
    }
    (cluster_rule,) = _find(objs, "ClusterRole", "holdwarden-certificates")["rules"]
    assert cluster_rule == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingwebhookconfigurations"],
        "resourceNames": [defaults.webhook_configuration],
        "verbs": ["get", "update"],
    }
    # The verification probe (certs/enforcing.py): dry-run creates in probeNamespace.
    probe = _find(objs, "Role", "holdwarden-enforcer-probe")
    assert probe["metadata"]["namespace"] == defaults.probe_namespace
    assert probe["rules"] == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["create"]},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["create"]},
    ]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for kind, name in (
        ("RoleBinding", "holdwarden-certificates"),
        ("ClusterRoleBinding", "holdwarden-certificates"),
        ("RoleBinding", "holdwarden-enforcer-probe"),
    ):
        binding = _find(objs, kind, name)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        ]
        assert binding["roleRef"]["name"] == name
    # ... and taken back for everything but dry runs, for that same account.
    guard = _find(objs, "ValidatingAdmissionPolicy", "holdwarden-enforcer-probe-dry-run-only")
    (who,) = guard["spec"]["matchConditions"]
    assert who["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{namespace}:{account}"'
    )
    assert [v["expression"] for v in guard["spec"]["validations"]] == [
        "has(request.dryRun) && request.dryRun == true"
    ]
    bound = _find(objs, "ValidatingAdmissionPolicyBinding", guard["metadata"]["name"])
    assert bound["spec"] == {"policyName": guard["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_self_managed_component_is_kept_empty_for_old_overlays() -> None:
    """Overlays that listed manifests/self-managed (before it was the default) still build,
    to the same objects as the base."""
    assert render(MANIFESTS, [MANIFESTS / "self-managed"]) == render(MANIFESTS)
