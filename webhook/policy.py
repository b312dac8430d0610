"""The enforcer's rules as a ValidatingAdmissionPolicy: CEL, evaluated inside the apiserver.

``render_rules_policy`` expresses the six rules of ``webhook/rules.py`` that are always on (the same
ids, the same order, the same decisions: five on CREATE and UPDATE, ``held-workload-kept`` on a
Workload's DELETE) and ``render_owner_only_policy`` the optional ``hold-owner-only`` rule, each as
one policy with its binding. ``manifests/policy`` ships them rendered for the default configuration
(a test checks they agree); for another ``annotationPrefix``, ``kueue.identities``,
``webhook.workloadDeleters`` or ``webhook.holderIdentities`` run ``python -m
holdwarden.webhook.policy --prefix P --kueue-identity ID --workload-deleter ID --holder ID`` and
apply its output instead (docs/explanation/policy.md).

Invariants (tests/controlplane/test_policy_parity.py proves them on the real kube-apiserver):
  - For every CREATE and UPDATE of a TrainJob or Workload, and every DELETE of a Workload, the
    policy refuses exactly when ``holdwarden.webhook.rules.evaluate`` does, and names the same rule
    first.
  - Every expression is null-safe: ``oldObject`` is null on CREATE, ``object`` on DELETE,
    and any field may be absent; an expression that errors would refuse the write
    (``failurePolicy: Fail``).

The one thing CEL makes awkward is the hold instance. This apiserver's CEL (v1.36) has no
``uint(string)`` and ``int(string)`` errors on out-of-range text, so instances are compared
as canonical decimal strings: valid means ``^[1-9][0-9]{0,18}$`` and, at 19 digits, not
above ``"9223372036854775807"`` (same length, so text order is numeric order); and for two
valid instances, ``a < b`` exactly when ``a`` is shorter, or as long and before in text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from holdwarden import labelselector
from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import (
    BREAK_GLASS_GROUP,
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_KUEUE_IDENTITIES,
    DEFAULT_WORKLOAD_DELETERS,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    RuleId,
)

# SKIPPED_NAMESPACES: the webhook's own namespaceSelector (manifests/webhook.yaml), so the
# same writes are judged.
from holdwarden.webhook.match_conditions import SKIPPED_NAMESPACES, kueue_namespace_selector

RULES_POLICY = "holdwarden-hold-rules"
OWNER_ONLY_POLICY = "holdwarden-hold-owner-only"
KUEUE_NAMESPACE_POLICY = "holdwarden-kueue-managed-namespaces"
# The supervisor's service account in the shipped examples (docs/install.md).
DEFAULT_HOLDER_IDENTITIES = ("system:serviceaccount:holdwarden-system:dispatch",)
MAX_INSTANCE = str(2**63 - 1)
HOLD_KEY_SUFFIXES = ("hold-instance", "hold-reason", "held-at", "held-by")


def _lit(text: str) -> str:
    """A CEL string literal. JSON's escapes (\\", \\\\, \\uXXXX) are valid CEL escapes."""
    return json.dumps(text)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_lit(item) for item in items) + "]"


def _shown(value: str) -> str:
    """CEL: ``value`` cut to 64 characters, with its line breaks and tabs escaped."""
    clipped = f"(size({value}) > 64 ? {value}.substring(0, 64) + '...' : {value})"
    return (
        f"{clipped}.replace('\\\\', '\\\\\\\\').replace('\\n', '\\\\n')"
        ".replace('\\r', '\\\\r').replace('\\t', '\\\\t')"
    )


def _valid(value: str) -> str:
    """CEL: ``value`` (a string expression) is a canonical instance in [1, 2^63-1]."""
    # The length test first: it bounds the regex's cost to 19 characters, whatever the
    # value's size (an annotation may be up to 256 KiB; CEL charges by length).
    return (
        f'(size({value}) <= 19 && {value}.matches("^[1-9][0-9]{{0,18}}$") '
        f"&& (size({value}) < 19 || {value} <= {_lit(MAX_INSTANCE)}))"
    )


def _lower(a: str, b: str) -> str:
    """CEL: canonical decimal ``a`` is numerically below canonical decimal ``b``."""
    return f"(size({a}) < size({b}) || (size({a}) == size({b}) && {a} < {b}))"


def _labels(labels: dict[str, str]) -> dict[str, Any]:
    return {"app.kubernetes.io/name": "holdwarden", "app.kubernetes.io/component": "policy"} | (
        labels
    )


def _match_constraints(workload_delete: bool) -> dict[str, Any]:
    # As the webhook registers: CREATE and UPDATE of the two kinds (and, for the rules
    # policy, a Workload's DELETE), not their status sub-resource; writes through another
    # served version are converted and judged too.
    return {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {
                "apiGroups": [TRAINJOB.group],
                "apiVersions": [TRAINJOB.version],
                "operations": ["CREATE", "UPDATE"],
                "resources": [TRAINJOB.plural],
            },
            {
                "apiGroups": [WORKLOAD.group],
                "apiVersions": [WORKLOAD.version],
                "operations": ["CREATE", "UPDATE", *(["DELETE"] if workload_delete else [])],
                "resources": [WORKLOAD.plural],
            },
        ],
    }


def _common_variables(prefix: str) -> list[dict[str, str]]:
    key = _lit(f"{prefix}/hold-instance")
    return [
        {
            "name": "newAnns",
            "expression": "object != null ? object.?metadata.?annotations.orValue({}) : {}",
        },
        {
            "name": "oldAnns",
            "expression": "oldObject != null ? oldObject.?metadata.?annotations.orValue({}) : {}",
        },
        {"name": "hasNew", "expression": f"{key} in variables.newAnns"},
        {"name": "hasOld", "expression": f"{key} in variables.oldAnns"},
        {"name": "newInst", "expression": f"variables.newAnns[?{key}].orValue('')"},
        {"name": "oldInst", "expression": f"variables.oldAnns[?{key}].orValue('')"},
        {"name": "newValid", "expression": f"variables.hasNew && {_valid('variables.newInst')}"},
        {"name": "oldValid", "expression": f"variables.hasOld && {_valid('variables.oldInst')}"},
        # The new value as a message shows it: a message that fails to build would lose the
        # rule's name (the apiserver then answers "failed expression: ..."). It fails when
        # too long (an annotation may be up to 256 KiB) and when it holds a line break
        # (so "5\n" is shown as 5\n, escaped, as the webhook's repr shows it).
        {"name": "newShown", "expression": _shown("variables.newInst")},
        {"name": "oldShown", "expression": _shown("variables.oldInst")},
        # The instance at stake, as the webhook reports it: the new value, else the old.
        {
            "name": "inst",
            "expression": "variables.hasNew ? variables.newInst : variables.oldInst",
        },
        {
            "name": "instFlag",
            "expression": (
                "(variables.hasNew ? variables.newValid : variables.oldValid) "
                "? variables.inst : 'N'"
            ),
        },
        {
            "name": "kind",
            "expression": f"request.resource.resource == {_lit(TRAINJOB.plural)} "
            f"? {_lit(TRAINJOB.kind)} : {_lit(WORKLOAD.kind)}",
        },
        {
            "name": "ref",
            "expression": "request.namespace + '/' + (request.name != '' ? request.name "
            ": object.?metadata.?generateName.orValue(''))",
        },
        # `holdwarden release` names the TrainJob: a Workload's controlling one.
        {
            "name": "owners",
            "expression": "[object, oldObject].filter(o, o != null)"
            ".map(o, o.?metadata.?ownerReferences.orValue([])"
            f".filter(r, r.kind == {_lit(TRAINJOB.kind)} && r.?controller.orValue(false)))"
            ".filter(l, size(l) > 0)",
        },
        {
            "name": "target",
            "expression": f"request.resource.resource == {_lit(TRAINJOB.plural)} "
            "? variables.ref : request.namespace + '/' + "
            "(size(variables.owners) > 0 ? variables.owners[0][0].name : '<its TrainJob>')",
        },
        {"name": "tjSuspend", "expression": "object.?spec.?suspend.orValue(false) == true"},
        {
            "name": "wlActive",
            "expression": "object.?spec.?active.orValue(true) != false",
        },
    ]


def _head(rule: RuleId) -> str:
    return f"'holdwarden [{rule}]: ' + variables.kind + ' ' + variables.ref"


def _release_hint(prefix: str) -> str:
    return (
        f"'release the hold first: remove the {prefix}/hold-* annotations in the same write, "
        "or use `holdwarden release ' + variables.target + ' --instance ' + "
        "variables.instFlag + '`'"
    )


def _rules_validations(
    prefix: str, kueue_identities: Sequence[str], workload_deleters: Sequence[str]
) -> list[dict[str, str]]:
    key = f"{prefix}/hold-instance"
    ids = _list(kueue_identities)
    deleters = _list(workload_deleters)
    trainjobs, workloads = _lit(TRAINJOB.plural), _lit(WORKLOAD.plural)
    suspend_old = "oldObject.?spec.?suspend.orValue(false) == true"
    return [
        {
            # A new or changed value must be canonical; stored garbage does not wedge.
            "expression": "!variables.hasNew "
            "|| (variables.hasOld && variables.oldInst == variables.newInst) "
            "|| variables.newValid",
            "messageExpression": f"{_head(RuleId.HOLD_INSTANCE_MALFORMED)} + ': {key}=\"' + "
            "variables.newShown + '\" is not a hold instance; write it as a decimal integer "
            f'from 1 to {MAX_INSTANCE} with no sign, spaces or leading zeros (e.g. "3"), or '
            f"remove the {prefix}/hold-* annotations.'",
        },
        {
            "expression": "!(variables.oldValid && variables.newValid && "
            f"{_lower('variables.newInst', 'variables.oldInst')})",
            "messageExpression": f"{_head(RuleId.HOLD_INSTANCE_MONOTONIC)} + ' carries hold "
            "instance ' + variables.oldInst + ' and this write would lower it to ' + "
            "variables.newInst + '; hold instances only grow, so this looks like a stale hold. "
            "Hold with an instance greater than ' + variables.oldInst + ', or "
            "release the hold first: remove the "
            f"{prefix}/hold-* annotations in the same write, or use `holdwarden release ' + "
            "variables.target + ' --instance ' + variables.oldInst + '`.'",
        },
        {
            "expression": f"request.resource.resource != {trainjobs} || !variables.hasNew "
            "|| variables.tjSuspend",
            "messageExpression": f"{_head(RuleId.HELD_TRAINJOB_SUSPENDED)} + ' is held "
            f"({key}=' + variables.newShown + ') and this write would leave spec.suspend not "
            "true; a held TrainJob must stay suspended. To run it, ' + "
            f"{_release_hint(prefix)} + '.'",
        },
        {
            "expression": f"request.resource.resource != {workloads} || !variables.hasNew "
            "|| !variables.wlActive",
            "messageExpression": f"{_head(RuleId.HELD_WORKLOAD_INACTIVE)} + ' is held "
            f"({key}=' + variables.newShown + ') and this write would leave spec.active not "
            "false; a held Workload must stay inactive. To run it, ' + "
            f"{_release_hint(prefix)} + '.'",
        },
        {
            "expression": f"request.resource.resource != {trainjobs} || oldObject == null "
            f"|| variables.tjSuspend == ({suspend_old}) "
            "|| ![object, oldObject].exists(o, "
            f"{_lit(QUEUE_NAME_LABEL)} in o.?metadata.?labels.orValue({{}})) "
            f"|| request.userInfo.username in {ids} "
            f"|| request.userInfo.?groups.orValue([]).exists(g, g in {ids})",
            "messageExpression": _kueue_owns_suspend_message(f"label {QUEUE_NAME_LABEL}"),
        },
        {
            # Only a DELETE reaches this with hasOld (the others need no such guard: on
            # DELETE hasNew is false and they pass); a TrainJob's DELETE is not matched.
            "expression": f"request.operation != 'DELETE' || request.resource.resource != "
            f"{workloads} || !variables.hasOld "
            f"|| request.userInfo.username in {deleters} "
            f"|| request.userInfo.?groups.orValue([]).exists(g, g in {deleters})",
            "messageExpression": f"{_head(RuleId.HELD_WORKLOAD_KEPT)} + ' is held "
            f"({key}=' + variables.oldShown + '); deleting it would drop the hold, since "
            "Kueue would create a new, active Workload for its TrainJob and run it. To delete "
            f"it, ' + {_release_hint(prefix)} + '; or delete the TrainJob itself (its "
            "Workload goes with it).'",
        },
    ]


def _kueue_owns_suspend_message(why: str) -> str:
    """kueue-owns-suspend's messageExpression; ``why`` is the text inside a single-quoted
    CEL string saying why the TrainJob is Kueue's (it may close the string to splice in a
    value): the webhook's words, holdwarden.webhook.rules.kueue_owns_suspend."""
    suspend_old = "oldObject.?spec.?suspend.orValue(false) == true"
    return (
        f"{_head(RuleId.KUEUE_OWNS_SUSPEND)} + ' is managed by Kueue "
        f"({why}) and ' + request.userInfo.username + ' may not change "
        f"spec.suspend (' + string({suspend_old}) + ' -> ' + string(variables.tjSuspend) + "
        "'); Kueue owns that field. To stop the job, deactivate its Workload (set "
        "spec.active: false, or `holdwarden hold ' + variables.ref + ' --instance N`); to "
        "let it run, activate the Workload and let Kueue admit it.'"
    )


def render_kueue_namespace_policy(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
    name: str = KUEUE_NAMESPACE_POLICY,
) -> Any:
    """kueue-owns-suspend for TrainJobs without the queue-name label, for
    ``kueue.manageJobsWithoutQueueName: true``: its binding (``kueue_namespace_binding``)
    selects the namespaces Kueue's ``managedJobsNamespaceSelector`` selects, as the
    webhook's second entry does. A labelled TrainJob is the rules policy's."""
    ids = _list(kueue_identities)
    suspend_old = "oldObject.?spec.?suspend.orValue(false) == true"
    validation = {
        "expression": "oldObject == null "
        f"|| variables.tjSuspend == ({suspend_old}) "
        "|| [object, oldObject].exists(o, "
        f"{_lit(QUEUE_NAME_LABEL)} in o.?metadata.?labels.orValue({{}})) "
        f"|| request.userInfo.username in {ids} "
        f"|| request.userInfo.?groups.orValue([]).exists(g, g in {ids})",
        "messageExpression": _kueue_owns_suspend_message(
            "namespace \\'' + request.namespace + '\\' is one Kueue\\'s "
            "managedJobsNamespaceSelector selects, and Kueue manages jobs without a queue "
            "name there"
        ),
    }
    policy = _policy(name, _common_variables(prefix), [validation], workload_delete=False)
    policy["spec"]["matchConstraints"] = {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {
                "apiGroups": [TRAINJOB.group],
                "apiVersions": [TRAINJOB.version],
                "operations": ["UPDATE"],
                "resources": [TRAINJOB.plural],
            }
        ],
    }
    return policy


def kueue_namespace_binding(selector: LabelSelector) -> Any:
    """The binding of ``render_kueue_namespace_policy``: the namespaces the webhook's second
    entry covers (Kueue's ``managedJobsNamespaceSelector``, less the skipped ones)."""
    return binding(KUEUE_NAMESPACE_POLICY, kueue_namespace_selector(selector, SKIPPED_NAMESPACES))


def _policy(
    name: str,
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
    workload_delete: bool,
) -> Any:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": _labels({})},
        "spec": {
            # An expression that cannot be evaluated refuses, as the webhook fails closed.
            "failurePolicy": "Fail",
            "matchConstraints": _match_constraints(workload_delete),
            "variables": variables,
            # Forbidden (403), as the webhook answers; the policy default would be 422.
            "validations": [dict(v, reason="Forbidden") for v in validations],
        },
    }


def binding(policy: str, namespace_selector: dict[str, Any] | None = None) -> Any:
    """The binding that puts ``policy`` in force (Deny), where the webhook judges too."""
    selector = namespace_selector or {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(SKIPPED_NAMESPACES),
            }
        ]
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy, "labels": _labels({})},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": selector},
        },
    }


def render_rules_policy(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
    name: str = RULES_POLICY,
    workload_deleters: Sequence[str] = DEFAULT_WORKLOAD_DELETERS,
) -> Any:
    """The ValidatingAdmissionPolicy with the five rules in ``RULE_ORDER`` and
    ``held-workload-kept`` (``DELETE_RULE_ORDER``)."""
    validations = _rules_validations(prefix, kueue_identities, workload_deleters)
    return _policy(name, _common_variables(prefix), validations, workload_delete=True)


def render_owner_only_policy(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    holder_identities: Sequence[str] = DEFAULT_HOLDER_IDENTITIES,
    name: str = OWNER_ONLY_POLICY,
) -> Any:
    """The ValidatingAdmissionPolicy with ``hold-owner-only``
    (holdwarden.webhook.rules.hold_owner_only).

    Refuses a change of any of the four hold annotations, or the reactivation of a Workload
    that carries one, by a writer that is neither a holder (username or group) nor in
    ``BREAK_GLASS_GROUP``.
    """
    if not holder_identities:
        raise ValueError("hold-owner-only needs at least one holder identity")
    keys = _list([f"{prefix}/{suffix}" for suffix in HOLD_KEY_SUFFIXES])
    holders = _list(holder_identities)
    variables = [
        *_common_variables(prefix),
        {
            "name": "changed",
            "expression": f"{keys}.exists(k, (k in variables.newAnns) != (k in variables.oldAnns)"
            " || (k in variables.newAnns && variables.newAnns[k] != variables.oldAnns[k]))",
        },
        {
            "name": "reactivated",
            "expression": f"request.resource.resource == {_lit(WORKLOAD.plural)} "
            f"&& oldObject != null && {keys}.exists(k, k in variables.oldAnns) "
            "&& oldObject.?spec.?active.orValue(true) == false && variables.wlActive",
        },
        {
            "name": "holder",
            "expression": f"request.userInfo.username in {holders} "
            "|| request.userInfo.?groups.orValue([]).exists(g, "
            f"g in {holders} || g == {_lit(BREAK_GLASS_GROUP)})",
        },
    ]
    validation = {
        "expression": "!(variables.changed || variables.reactivated) || variables.holder",
        "messageExpression": f"{_head(RuleId.HOLD_OWNER_ONLY)} + ': only the holder may "
        "place, change or lift a hold, and ' + request.userInfo.username + ' is not a holder "
        "(webhook.holderIdentities), so it may not ' + (variables.reactivated && "
        "!variables.changed ? 'reactivate this held Workload' : 'change its hold') + "
        f"' (the {prefix}/hold-* annotations' + (variables.reactivated ? ', spec.active' : '')"
        " + '). Ask the holder to release it (`holdwarden release ' + variables.target + "
        "' --instance ' + variables.instFlag + '`); in an emergency a cluster admin in "
        f"{BREAK_GLASS_GROUP} may (docs/explanation/policy.md, break-glass).'",
    }
    # Not on DELETE: the webhook's hold-owner-only judges CREATE and UPDATE only.
    return _policy(name, variables, [validation], workload_delete=False)


def _dump(documents: Sequence[Any], header: str) -> str:
    return header + "---\n".join(
        yaml.safe_dump(doc, sort_keys=False, width=100) for doc in documents
    )


def rules_manifest(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
    workload_deleters: Sequence[str] = DEFAULT_WORKLOAD_DELETERS,
) -> str:
    """manifests/policy/policy.yaml for this configuration (the policy and its binding)."""
    header = (
        "# Generated by `python -m holdwarden.webhook.policy` for annotationPrefix "
        f"{prefix!r}, kueue.identities {list(kueue_identities)!r}\n"
        f"# and webhook.workloadDeleters {list(workload_deleters)!r}; do not edit by hand\n"
        "# (a test checks it against webhook/policy.py). docs/explanation/policy.md explains it.\n"
    )
    policy = render_rules_policy(prefix, kueue_identities, workload_deleters=workload_deleters)
    return _dump([policy, binding(RULES_POLICY)], header)


def owner_only_manifest(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    holder_identities: Sequence[str] = DEFAULT_HOLDER_IDENTITIES,
) -> str:
    """manifests/policy/owner-only/policy.yaml for this configuration."""
    header = (
        "# Generated by `python -m holdwarden.webhook.policy --owner-only` for annotationPrefix "
        f"{prefix!r} and holders {list(holder_identities)!r};\n"
        "# do not edit by hand (a test checks it). Must equal webhook.holderIdentities.\n"
    )
    return _dump(
        [render_owner_only_policy(prefix, holder_identities), binding(OWNER_ONLY_POLICY)], header
    )


def kueue_namespace_manifest(
    prefix: str = DEFAULT_ANNOTATION_PREFIX,
    kueue_identities: Sequence[str] = DEFAULT_KUEUE_IDENTITIES,
    selector: LabelSelector | None = None,
) -> str:
    """The policy and binding for ``kueue.manageJobsWithoutQueueName: true``."""
    chosen = selector or labelselector.kueue_default()
    header = (
        "# Generated by `python -m holdwarden.webhook.policy --kueue-namespace-policy`"
        " for annotationPrefix "
        f"{prefix!r},\n# kueue.identities {list(kueue_identities)!r} and "
        f"kueue.managedJobsNamespaceSelector {json.dumps(chosen.to_dict())}.\n"
    )
    return _dump(
        [render_kueue_namespace_policy(prefix, kueue_identities), kueue_namespace_binding(chosen)],
        header,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the policy manifests for a configuration other than the shipped default."""
    parser = argparse.ArgumentParser(
        prog="python -m holdwarden.webhook.policy",
        description="Print holdwarden's ValidatingAdmissionPolicy and binding for the given "
        "annotationPrefix and kueue.identities (or, with --owner-only, the hold-owner-only "
        "policy for the given holders). They must equal the ConfigMap's.",
    )
    parser.add_argument("--prefix", default=DEFAULT_ANNOTATION_PREFIX)
    parser.add_argument("--kueue-identity", action="append", dest="identities", metavar="ID")
    parser.add_argument("--workload-deleter", action="append", dest="deleters", metavar="ID")
    parser.add_argument("--owner-only", action="store_true")
    parser.add_argument("--holder", action="append", dest="holders", metavar="ID")
    parser.add_argument(
        "--kueue-namespace-policy",
        action="store_true",
        help="print instead the policy for Kueue's manageJobsWithoutQueueName (the webhook's "
        "second entry's twin) and its binding",
    )
    parser.add_argument(
        "--managed-jobs-namespace-selector",
        metavar="JSON",
        help="with --kueue-namespace-policy: Kueue's managedJobsNamespaceSelector as JSON "
        "(default: Kueue's own)",
    )
    args = parser.parse_args(argv)
    if args.kueue_namespace_policy:
        try:
            selector = labelselector.from_flag(
                args.managed_jobs_namespace_selector, "--managed-jobs-namespace-selector"
            )
        except labelselector.SelectorError as exc:
            parser.error(f"--managed-jobs-namespace-selector: {exc}")
        identities = tuple(args.identities) if args.identities else DEFAULT_KUEUE_IDENTITIES
        sys.stdout.write(kueue_namespace_manifest(args.prefix, identities, selector))
    elif args.owner_only:
        holders = tuple(args.holders) if args.holders else DEFAULT_HOLDER_IDENTITIES
        sys.stdout.write(owner_only_manifest(args.prefix, holders))
    else:
        identities = tuple(args.identities) if args.identities else DEFAULT_KUEUE_IDENTITIES
        deleters = tuple(args.deleters) if args.deleters else DEFAULT_WORKLOAD_DELETERS
        sys.stdout.write(rules_manifest(args.prefix, identities, deleters))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
