"""manifests/self-managed: the component agrees with the base and with the configuration
defaults it relies on, and grants exactly what certs/selfmanaged.py uses. (The real
apiserver's strict dry run of every rendered object is in tests/test_manifests_render.py,
whose VARIANTS include it; tests/test_certs_selfmanaged.py runs the enforcer under these
rules.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from holdwarden.config import CertificatesConfig, Config
from tests.kustomize import render

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
COMPONENT = MANIFESTS / "self-managed"


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_pod_gets_its_token_the_flag_and_no_certificate_volume() -> None:
    base = _find(render(MANIFESTS), "Deployment", "holdwarden")["spec"]["template"]["spec"]
    pod = _find(render(MANIFESTS, [COMPONENT]), "Deployment", "holdwarden")["spec"]["template"][
        "spec"
    ]
    assert base["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    (base_container,) = base["containers"]
    assert container["args"] == [*base_container["args"], "--certificates=self-managed"]
    # Exactly the base's certificate volume and its mount are gone, nothing else.
    assert [v["name"] for v in pod["volumes"]] == [
        v["name"] for v in base["volumes"] if v["name"] != "tls"
    ]
    assert [m["name"] for m in container["volumeMounts"]] == [
        m["name"] for m in base_container["volumeMounts"] if m["name"] != "tls"
    ]


def test_the_defaults_name_what_the_component_grants_and_the_base_ships() -> None:
    objs = render(MANIFESTS, [COMPONENT])
    defaults = CertificatesConfig()
    deployment = _find(objs, "Deployment", "holdwarden")
    namespace = deployment["metadata"]["namespace"]
    # The ConfigMap's configuration with the flag: self-managed, with the defaults below.
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
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for kind, name in (
        ("RoleBinding", "holdwarden-certificates"),
        ("ClusterRoleBinding", "holdwarden-certificates"),
    ):
        binding = _find(objs, kind, name)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        ]
        assert binding["roleRef"]["name"] == "holdwarden-certificates"


def test_not_with_cert_manager() -> None:
    """Two writers of one caBundle would fight: the component says so, and neither
    patches the other's objects."""
    text = (COMPONENT / "kustomization.yaml").read_text()
    assert "Not together with manifests/cert-manager" in text
    objs = render(MANIFESTS, [COMPONENT])
    webhook = _find(objs, "ValidatingWebhookConfiguration", "holdwarden-enforcer")
    assert "cert-manager.io/inject-ca-from" not in webhook["metadata"].get("annotations", {})
