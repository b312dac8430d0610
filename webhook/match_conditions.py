"""The CEL ``matchConditions`` that narrow which writes the apiserver sends to the enforcer.

With ``failurePolicy: Fail``, every write the apiserver sends is refused while no enforcer
replica answers. So the apiserver should send only the writes that could break a hold
invariant, and decide that itself, before calling anyone. A write is sent when

  (H) the old or the new object carries one of the hold annotations
      (``P/hold-instance``, ``P/hold-reason``, ``P/held-at``, ``P/held-by``), or
  (K) it is an UPDATE of a TrainJob whose effective ``spec.suspend`` (absent = false)
      changes, the old or the new object carries the Kueue queue label, and the writer
      is not one of ``kueue.identities`` (by username or by any group).

Why this set, checked against ``webhook/rules.py``
(tests/controlplane/test_webhook_blast_radius.py proves it with the conditions evaluated
by the real apiserver):

  - ``held-*`` and ``hold-instance-malformed`` need the new object to carry
    ``P/hold-instance``; ``hold-instance-monotonic`` needs both to: all inside (H).
  - ``kueue-owns-suspend`` refuses exactly (K); Kueue's own suspend changes pass without
    a call, so Kueue can admit and preempt unheld jobs while the enforcer is down.
  - the optional ``hold-owner-only`` rule (design.md) refuses changes to the hold
    annotations and the reactivation of a held Workload: both have a hold annotation on
    the old or the new object, so (H) already sends them.
  - ``P/opened`` and ``P/attempt`` are deliberately not in (H): no rule reads them, and
    matching them would send every write to every opened TrainJob.

On CREATE ``oldObject`` is null, and an error in a condition would count as a failed call
(refused, with ``failurePolicy: Fail``), so every access is null-safe (optional field
selection, ``orValue``). The cost is constant: four key lookups per object, one label
lookup per object, and the identity list.

``manifests/webhook.yaml`` ships ``render()`` for the default configuration (a test checks
they agree). For another ``annotationPrefix`` or other ``kueue.identities``, print an
overlay patch with ``python -m holdwarden.webhook.match_conditions --prefix P --kueue-identity ID``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from holdwarden import labelselector
from holdwarden.labelselector import NAMESPACE_NAME_LABEL, LabelSelector
from holdwarden.vocabulary import (
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_KUEUE_IDENTITIES,
    KUEUE_NAMESPACE_PATH,
    KUEUE_NAMESPACE_WEBHOOK,
    QUEUE_NAME_LABEL,
    TRAINJOB,
)

CONDITION_NAME = "could-break-a-hold"
KUEUE_NAMESPACE_CONDITION_NAME = "kueue-owns-suspend-without-queue-name"
# kube-system and holdwarden's own namespace are never judged (manifests/webhook.yaml).
SKIPPED_NAMESPACES = ("kube-system", "holdwarden-system")
# Every webhook entry's timeoutSeconds (the API's default). With failurePolicy Fail a call
# that times out refuses the write, so the timeout is headroom against a slow answer, not
# a latency target: on two CPU-starved cores (tests/pods under two busy loops) refusals,
# which wait for their audit line, took up to 5 s during rollouts, and 5 s timeouts
# refused a few held writes the rules allow.
WEBHOOK_TIMEOUT_SECONDS = 10

# The hold keys without their prefix (vocabulary.Annotations.hold_keys, the same four).
HOLD_KEY_SUFFIXES = ("hold-instance", "hold-reason", "held-at", "held-by")


def _literal(text: str) -> str:
    """A CEL string literal. JSON's escapes (\\", \\\\, \\uXXXX) are valid CEL escapes."""
    return json.dumps(text)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_literal(item) for item in items) + "]"


def render(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
) -> str:
    """The CEL expression for ``annotationPrefix`` ``prefix`` and ``kueue.identities``."""
    ids = _list(kueue_identities)
    return "\n".join(
        [
            "[object, oldObject].exists(o, o != null &&",
            f"  {_list(HOLD_KEY_SUFFIXES)}.exists(k,",
            f"    ({_literal(prefix + '/')} + k) in o.?metadata.?annotations.orValue({{}})))",
            f"|| (request.resource.resource == {_literal(TRAINJOB.plural)}",
            "    && object != null && oldObject != null",
            "    && (object.?spec.?suspend.orValue(false) == true)",
            "       != (oldObject.?spec.?suspend.orValue(false) == true)",
            "    && [object, oldObject].exists(o,",
            f"         {_literal(QUEUE_NAME_LABEL)} in o.?metadata.?labels.orValue({{}}))",
            f"    && !(request.userInfo.username in {ids}",
            f"         || request.userInfo.?groups.orValue([]).exists(g, g in {ids})))",
        ]
    )


def render_kueue_namespace(kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES) -> str:
    """The second entry's CEL expression (Kueue manages jobs without a queue name): an
    UPDATE of a TrainJob whose effective ``spec.suspend`` changes, that carries the queue
    label on neither the old nor the new object (those are the first entry's, (K)), by a
    writer that is not one of ``kueue.identities``."""
    ids = _list(kueue_identities)
    return "\n".join(
        [
            f"request.resource.resource == {_literal(TRAINJOB.plural)}",
            "&& object != null && oldObject != null",
            "&& (object.?spec.?suspend.orValue(false) == true)",
            "   != (oldObject.?spec.?suspend.orValue(false) == true)",
            "&& ![object, oldObject].exists(o,",
            f"     {_literal(QUEUE_NAME_LABEL)} in o.?metadata.?labels.orValue({{}}))",
            f"&& !(request.userInfo.username in {ids}",
            f"     || request.userInfo.?groups.orValue([]).exists(g, g in {ids}))",
        ]
    )


def kueue_namespace_selector(
    selector: LabelSelector, skipped_namespaces: Sequence[str] = SKIPPED_NAMESPACES
) -> dict[str, Any]:
    """The second entry's ``namespaceSelector``: Kueue's ``managedJobsNamespaceSelector``
    and, as the first entry has, none of ``skipped_namespaces`` (requirements are ANDed)."""
    out = selector.to_dict()
    out["matchExpressions"] = [
        *out.get("matchExpressions", []),
        {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": list(skipped_namespaces)},
    ]
    return out


def kueue_namespace_webhook(
    client_config: dict[str, Any],
    selector: LabelSelector,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
    *,
    failure_policy: str = "Ignore",
    skipped_namespaces: Sequence[str] = SKIPPED_NAMESPACES,
) -> dict[str, Any]:
    """The second webhook entry, for ``kueue.manageJobsWithoutQueueName: true``.

    ``client_config`` is the first entry's with ``path`` replaced by
    ``KUEUE_NAMESPACE_PATH`` (pass the first entry's; this sets the path). Only TrainJob
    UPDATEs: kueue-owns-suspend judges nothing else. ``failure_policy`` starts as the first
    entry's does (Ignore until verified; certs/enforcing.py then sets every entry's).
    """
    config = dict(client_config)
    if "service" in config:
        config["service"] = dict(config["service"], path=KUEUE_NAMESPACE_PATH)
    elif "url" in config:
        base = str(config["url"]).split("/validate", 1)[0]
        config["url"] = base + KUEUE_NAMESPACE_PATH
    return {
        "name": KUEUE_NAMESPACE_WEBHOOK,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
        "namespaceSelector": kueue_namespace_selector(selector, skipped_namespaces),
        "matchConditions": [
            {
                "name": KUEUE_NAMESPACE_CONDITION_NAME,
                "expression": render_kueue_namespace(kueue_identities),
            }
        ],
        "clientConfig": config,
        "rules": [
            {
                "apiGroups": [TRAINJOB.group],
                "apiVersions": [TRAINJOB.version],
                "operations": ["UPDATE"],
                "resources": [TRAINJOB.plural],
                "scope": "Namespaced",
            }
        ],
    }


def match_conditions(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
) -> list[dict[str, str]]:
    """The ``matchConditions`` list of the enforcer's webhook."""
    return [{"name": CONDITION_NAME, "expression": render(prefix, kueue_identities)}]


def same_expression(a: str, b: str) -> bool:
    """Two expressions are the same up to whitespace (YAML folding, indentation).

    Safe because no literal the expression contains has a space in it.
    """
    return a.split() == b.split()


def overlay_patch(prefix: str, kueue_identities: Sequence[str]) -> str:
    """A kustomize JSON 6902 patch that replaces the shipped condition's expression.

    JSON 6902 rather than a strategic merge: its meaning does not depend on the merge keys
    kustomize knows for this kind. Use it from an overlay's kustomization.yaml with
    ``target: {kind: ValidatingWebhookConfiguration, name: holdwarden-enforcer}``.
    """
    ops = [
        {
            "op": "replace",
            "path": "/webhooks/0/matchConditions/0/expression",
            "value": render(prefix, kueue_identities),
        }
    ]

    # Block style for the multi-line expression, so the patch stays readable.
    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    header = (
        "# holdwarden matchConditions for annotationPrefix "
        f"{prefix!r}; kueue.identities {list(kueue_identities)!r}.\n"
        "# kustomization.yaml: patches: [{path: THIS_FILE, target: "
        "{kind: ValidatingWebhookConfiguration, name: holdwarden-enforcer}}]\n"
    )
    return header + yaml.dump(ops, Dumper=_Dumper, sort_keys=False)


SHIPPED_CLIENT_CONFIG: dict[str, Any] = {
    "service": {
        "name": "holdwarden",
        "namespace": "holdwarden-system",
        "path": "/validate",
        "port": 443,
    }
}


def kueue_namespace_patch(
    selector: LabelSelector,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
) -> str:
    """A kustomize JSON 6902 patch that adds the second webhook entry (for
    ``kueue.manageJobsWithoutQueueName: true``) to the shipped configuration, for Kueue's
    ``managedJobsNamespaceSelector`` ``selector``; manifests/kueue-manage-all ships it for
    Kueue's default selector."""
    entry = kueue_namespace_webhook(SHIPPED_CLIENT_CONFIG, selector, kueue_identities)
    ops = [{"op": "add", "path": "/webhooks/-", "value": entry}]

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    header = (
        "# Generated by `python -m holdwarden.webhook.match_conditions --kueue-namespace-entry`;"
        " do not\n"
        "# edit by hand (a test checks it). The enforcer's second webhook entry, for\n"
        f"# kueue.managedJobsNamespaceSelector {json.dumps(selector.to_dict())}\n"
        f"# and kueue.identities {json.dumps(list(kueue_identities))} (docs/configuration.md).\n"
    )
    return header + yaml.dump(ops, Dumper=_Dumper, sort_keys=False, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    """Print an overlay patch for a configuration other than the shipped default."""
    parser = argparse.ArgumentParser(
        prog="python -m holdwarden.webhook.match_conditions",
        description="Print a kustomize patch with the enforcer's matchConditions for the "
        "given annotationPrefix and kueue.identities (they must equal the ConfigMap's).",
    )
    parser.add_argument("--prefix", default=DEFAULT_ANNOTATION_PREFIX)
    parser.add_argument(
        "--kueue-identity",
        action="append",
        dest="identities",
        metavar="ID",
        help="a user or group in kueue.identities (repeat; default: Kueue's service account)",
    )
    parser.add_argument(
        "--kueue-namespace-entry",
        action="store_true",
        help="print instead the patch that adds the second webhook entry, for Kueue's "
        "manageJobsWithoutQueueName (docs/configuration.md)",
    )
    parser.add_argument(
        "--managed-jobs-namespace-selector",
        metavar="JSON",
        help="with --kueue-namespace-entry: Kueue's managedJobsNamespaceSelector as JSON "
        "(default: Kueue's own, every namespace but kube-system and kueue-system)",
    )
    args = parser.parse_args(argv)
    identities = tuple(args.identities) if args.identities else DEFAULT_KUEUE_IDENTITIES
    if args.kueue_namespace_entry:
        try:
            selector = labelselector.from_flag(
                args.managed_jobs_namespace_selector, "--managed-jobs-namespace-selector"
            )
        except labelselector.SelectorError as exc:
            parser.error(f"--managed-jobs-namespace-selector: {exc}")
        sys.stdout.write(kueue_namespace_patch(selector, identities))
        return 0
    sys.stdout.write(overlay_patch(args.prefix, identities))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
