"""The enforcer's webhook entry as manifests/webhook.yaml ships it, for tests that register
webhooks in the real apiserver: they take the shipped matchConditions and namespaceSelector
from the file itself, so they test what is installed, not a copy of it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

WEBHOOK_MANIFEST = Path(__file__).resolve().parent.parent / "manifests" / "webhook.yaml"


def shipped_webhook() -> dict[str, Any]:
    """The one webhook of the shipped ValidatingWebhookConfiguration (a fresh copy)."""
    document = yaml.safe_load(WEBHOOK_MANIFEST.read_text())
    (hook,) = document["webhooks"]
    return copy.deepcopy(dict(hook))


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
