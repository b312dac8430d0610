"""The enforcer's webhook entry as manifests/webhook.yaml ships it, for tests that register
webhooks in the real apiserver: they take the shipped matchConditions and namespaceSelector
from the file itself, so they test what is installed, not a copy of it."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION

WEBHOOK_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "webhook.yaml"


def shipped_webhook() -> dict[str, Any]:
    """The one webhook of the shipped ValidatingWebhookConfiguration (a fresh copy), as it
    is once installed and verified: the manifest ships ``failurePolicy: Ignore`` and the
    self-managed leader sets the annotation's policy (certs/enforcing.py), so the
    copy carries that one (``Fail``)."""
    document = yaml.safe_load(WEBHOOK_MANIFEST.read_text())
    (hook,) = document["webhooks"]
    assert hook["failurePolicy"] == "Ignore", "shipped Ignore until verified"
    wanted = document["metadata"]["annotations"][FAILURE_POLICY_ANNOTATION]
    return copy.deepcopy(dict(hook, failurePolicy=wanted))


def shipped_rules(api_versions: str = "*") -> list[dict[str, Any]]:
    """The shipped rules (resources and operations: DELETE for Workloads), for every served
    version unless ``api_versions`` names one (tests also write through other versions)."""
    rules = shipped_webhook()["rules"]
    return [dict(rule, apiVersions=[api_versions]) for rule in rules]


def shipped_match_conditions() -> list[dict[str, str]]:
    """The shipped ``matchConditions``, verbatim."""
    return list(shipped_webhook()["matchConditions"])


def shipped_namespace_selector(extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The shipped ``namespaceSelector``, optionally ANDed with ``extra_labels``.

    Tests share one apiserver, so each registration is also confined to namespaces carrying
    its own label; the shipped expressions still apply on top.
    """
    selector: dict[str, Any] = shipped_webhook()["namespaceSelector"]
    if extra_labels:
        selector = dict(selector, matchLabels={**selector.get("matchLabels", {}), **extra_labels})
    return selector


def local_webhook(
    port: int,
    selector: dict[str, str],
    *,
    ca_pem: bytes | None = None,
    name: str = "holds.holdwarden.io",
    rules: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One webhook entry as shipped (rules, matchConditions, Fail, 5 s), calling an enforcer
    on 127.0.0.1:``port``, for namespaces labelled ``selector``; no ``ca_pem``: an empty
    caBundle (self-managed certificates inject it)."""
    client: dict[str, Any] = {"url": f"https://127.0.0.1:{port}/validate"}
    if ca_pem is not None:
        client["caBundle"] = base64.b64encode(ca_pem).decode()
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 5,
        "clientConfig": client,
        "rules": rules if rules is not None else shipped_rules(),
        "namespaceSelector": {"matchLabels": dict(selector)},
        "matchConditions": shipped_match_conditions(),
    }


def local_registration(name: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration ``name`` holding ``webhooks``."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": list(webhooks),
    }
