"""The enforcer's rules: pure functions from one admission request to a verdict.

Nothing here does I/O, reads a clock or keeps state. Each rule takes a ``Change`` (a small
typed view of the request) and a ``RulesConfig`` and returns a ``Violation`` or ``None``.

Which requests are judged (``skip_reason`` says why one is not):
  - resource ``trainjobs`` in group ``trainer.kubeflow.org`` or ``workloads`` in group
    ``kueue.x-k8s.io`` (any version: the fields the rules read are the same in every
    served version);
  - with an empty sub-resource (``status`` writes cannot change metadata or spec);
  - operation CREATE or UPDATE (docs/reference/rules.md, "What is judged"). CREATE is
    judged too, because an object that is created held-but-running breaks the invariant
    just as an update does, and the adapter's preflight probes the enforcer with a dry-run
    CREATE. On CREATE there is no old object, so only the rules that look at the new object
    alone can fire (held-*, malformed).
  - DELETE of a Workload whose stored object carries a hold (rule held-workload-kept,
    ``DELETE_RULE_ORDER``): Kueue would replace a deleted Workload with a fresh, active one.
Everything else (DELETE of a TrainJob, CONNECT, other kinds, sub-resources) is allowed;
``skip_reason`` says why, for the log.

Evaluation order (``RULE_ORDER``) is fixed, and ``evaluate`` returns the FIRST violation:
  1. hold-instance-malformed   a garbled value makes every other hold judgement meaningless
  2. hold-instance-monotonic   a stale writer lowering the instance is the most specific cause
  3. held-trainjob-suspended
  4. held-workload-inactive
  5. kueue-owns-suspend
  6. hold-owner-only           optional; last, so a state rule's more specific message wins
``violations`` returns every violation in that order (for tests and diagnostics); the
response and the audit line carry the first.

Decisions the contract leaves open, written down here and in docs/reference/rules.md:
  - "carries P/hold-instance" means the key is present with any value: a garbled hold is
    still a hold, so the held-* rules apply to it too.
  - hold-instance-monotonic compares two VALID instances only. Removing the annotation is a
    Release and is allowed; adding one where there was none is a Hold and is allowed; a
    garbled old value cannot be "lowered" (it is left to hold-instance-malformed).
  - hold-instance-malformed refuses only when the NEW value is malformed AND differs from
    the old value (or there was none). Garbage already stored (written before the enforcer
    was installed) therefore cannot wedge the object: unrelated writes, and the write that
    fixes or removes the value, still pass.
  - A TrainJob is Kueue-managed when the old OR the new object carries the queue-name
    label, so dropping the label in the same write does not escape kueue-owns-suspend.
    Where Kueue manages jobs without a queue name (``kueue.manageJobsWithoutQueueName``),
    every TrainJob in a namespace Kueue's ``managedJobsNamespaceSelector`` selects is
    Kueue-managed too. The rules cannot see a namespace's labels, so the apiserver decides
    that: a second webhook entry with that selector as its ``namespaceSelector`` sends
    those writes to ``KUEUE_NAMESPACE_PATH``, judged with
    ``RulesConfig.kueue_managed_namespace`` (kueue-owns-suspend only).
    ``spec.suspend`` absent counts as false; only a change of the effective value counts.
  - An identity is Kueue's when the username, or one of the groups, is listed in
    ``kueue.identities``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from holdwarden import objects
from holdwarden.config import Config
from holdwarden.vocabulary import (
    BREAK_GLASS_GROUP,
    DEFAULT_WORKLOAD_DELETERS,
    MAX_HOLD_INSTANCE,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    RuleId,
    parse_hold_instance,
)

JUDGED_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE"})


@dataclass(frozen=True, slots=True)
class RulesConfig:
    """What the rules need from the configuration."""

    annotations: Annotations
    kueue_identities: frozenset[str]
    # hold-owner-only is on when this is not empty (``webhook.holderIdentities``).
    holder_identities: frozenset[str] = frozenset()
    # held-workload-kept: who may delete a held Workload (``webhook.workloadDeleters``).
    workload_deleters: frozenset[str] = frozenset(DEFAULT_WORKLOAD_DELETERS)
    # True for the requests of the second webhook entry (KUEUE_NAMESPACE_PATH), whose
    # namespaceSelector is Kueue's managedJobsNamespaceSelector: there Kueue manages every
    # TrainJob, queue-name label or not, and only kueue-owns-suspend is judged (the first
    # entry judges everything else, so nothing is refused or audited twice).
    kueue_managed_namespace: bool = False
    # The hold-instance key, spelled once (``Annotations`` builds it on every access).
    hold_key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hold_key", self.annotations.hold_instance)

    @classmethod
    def from_config(cls, config: Config) -> RulesConfig:
        return cls(
            Annotations(config.annotation_prefix),
            frozenset(config.kueue_identities),
            frozenset(config.webhook.holder_identities),
            frozenset(config.webhook.workload_deleters),
        )


class Change(msgspec.Struct, frozen=True):
    """A typed view of one admission request, as much of it as the rules read.

    ``old`` is None on CREATE (and ``new`` None on DELETE); both are the raw objects from
    the AdmissionReview, never mutated.

    Immutable, like a frozen dataclass; a msgspec Struct because one is built per review
    and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost ~2 us
    of a 20 KB review's ~80 us over the aiohttp floor, against ~0.2 us for this.
    """

    group: str
    resource: str
    subresource: str
    operation: str
    namespace: str
    name: str
    username: str
    groups: tuple[str, ...]
    old: Mapping[str, Any] | None
    new: Mapping[str, Any] | None

    @property
    def is_trainjob(self) -> bool:
        return self.group == TRAINJOB.group and self.resource == TRAINJOB.plural

    @property
    def is_workload(self) -> bool:
        return self.group == WORKLOAD.group and self.resource == WORKLOAD.plural

    @property
    def kind(self) -> str:
        if self.is_trainjob:
            return TRAINJOB.kind
        if self.is_workload:
            return WORKLOAD.kind
        return self.resource

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class Violation:
    """A refusal: the rule that refused, a message for the writer, and the instance at stake
    (the raw annotation value of the new object, else the old one; None if neither has one).
    """

    rule: RuleId
    message: str
    instance: str | None


def skip_reason(change: Change) -> str | None:
    """Why this request is not judged at all (None: it is judged by the rules)."""
    if not (change.is_trainjob or change.is_workload):
        return f"resource {change.resource!r} in group {change.group!r} is not judged"
    if change.subresource:
        return f"sub-resource {change.subresource!r} is not judged"
    if change.operation not in JUDGED_OPERATIONS:
        return f"operation {change.operation!r} is not judged"
    if change.operation == "DELETE":
        if not change.is_workload:
            return "DELETE is not judged for TrainJobs (only a held Workload's is)"
        if change.old is None:
            return "DELETE carries no old object"
        return None
    if change.new is None:
        return "request carries no object"
    return None


# --- reading objects defensively: the apiserver has schema-validated them, but a rule must
# --- never raise on a shape it did not expect.


def _labelled_for_kueue(change: Change) -> bool:
    # Old OR new: dropping the label in the same write does not escape the rule.
    return objects.is_kueue_managed(change.old) or objects.is_kueue_managed(change.new)


def _is_kueue(change: Change, config: RulesConfig) -> bool:
    ids = config.kueue_identities
    return change.username in ids or any(group in ids for group in change.groups)


def _release_hint(change: Change, config: RulesConfig, instance: str | None) -> str:
    keys = f"{config.annotations.prefix}/hold-*"
    if change.is_workload:
        owner = objects.controller_trainjob(change.new) or objects.controller_trainjob(change.old)
        target = (
            f"{change.namespace}/{owner.name}" if owner else f"{change.namespace}/<its TrainJob>"
        )
    else:
        target = change.ref
    number = parse_hold_instance(instance)
    flag = f" --instance {number}" if number is not None else " --instance N"
    return (
        f"release the hold first: remove the {keys} annotations in the same write, "
        f"or use `holdwarden release {target}{flag}`"
    )


SHOWN_LIMIT = 64


def shown(value: str) -> str:
    """A value as a message shows it: at most SHOWN_LIMIT characters (then "..."), with
    backslashes, line breaks and tabs escaped, so one refusal stays one line. The policy
    twin spells it the same way in CEL (holdwarden.webhook.policy._shown), so both say the same."""
    clipped = value[:SHOWN_LIMIT] + "..." if len(value) > SHOWN_LIMIT else value
    return (
        clipped.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )


def _prefix(rule: RuleId, change: Change) -> str:
    return f"holdwarden [{rule}]: {change.kind} {change.ref}"


# --- the rules ---------------------------------------------------------------------------


def held_trainjob_suspended(change: Change, config: RulesConfig) -> Violation | None:
    """A TrainJob that would carry ``P/hold-instance`` must have ``spec.suspend: true``."""
    if not change.is_trainjob:
        return None
    instance = objects.hold_instance_text(change.new, config.hold_key)
    if instance is None or objects.suspended(change.new):
        return None
    rule = RuleId.HELD_TRAINJOB_SUSPENDED
    return Violation(
        rule,
        f"{_prefix(rule, change)} is held ({config.annotations.hold_instance}={shown(instance)}) "
        f"and this write would leave spec.suspend not true; a held TrainJob must stay "
        f"suspended. To run it, {_release_hint(change, config, instance)}.",
        instance,
    )


def held_workload_inactive(change: Change, config: RulesConfig) -> Violation | None:
    """A Workload that would carry ``P/hold-instance`` must have ``spec.active: false``."""
    if not change.is_workload:
        return None
    instance = objects.hold_instance_text(change.new, config.hold_key)
    if instance is None or not objects.active(change.new):
        return None
    rule = RuleId.HELD_WORKLOAD_INACTIVE
    return Violation(
        rule,
        f"{_prefix(rule, change)} is held ({config.annotations.hold_instance}={shown(instance)}) "
        f"and this write would leave spec.active not false; a held Workload must stay "
        f"inactive. To run it, {_release_hint(change, config, instance)}.",
        instance,
    )


def kueue_owns_suspend(change: Change, config: RulesConfig) -> Violation | None:
    """Only Kueue may change ``spec.suspend`` of a Kueue-managed TrainJob (UPDATE only)."""
    if not change.is_trainjob or change.old is None:
        return None
    old, new = objects.suspended(change.old), objects.suspended(change.new)
    if old == new or _is_kueue(change, config):
        return None
    if _labelled_for_kueue(change):
        why = f"label {QUEUE_NAME_LABEL}"
    elif config.kueue_managed_namespace:
        why = (
            f"namespace {change.namespace!r} is one Kueue's managedJobsNamespaceSelector "
            "selects, and Kueue manages jobs without a queue name there"
        )
    else:
        return None
    rule = RuleId.KUEUE_OWNS_SUSPEND
    instance = objects.hold_instance_text(
        change.new, config.hold_key
    ) or objects.hold_instance_text(change.old, config.annotations)
    return Violation(
        rule,
        f"{_prefix(rule, change)} is managed by Kueue ({why}) and "
        f"{change.username or 'this writer'} may not change spec.suspend "
        f"({str(old).lower()} -> {str(new).lower()}); Kueue owns that field. "
        f"To stop the job, deactivate its Workload (set spec.active: false, or "
        f"`holdwarden hold {change.ref} --instance N`); to let it run, activate the Workload "
        f"and let Kueue admit it.",
        instance,
    )


def hold_instance_monotonic(change: Change, config: RulesConfig) -> Violation | None:
    """An update must not lower a valid ``P/hold-instance`` to a smaller valid instance."""
    if change.old is None:
        return None
    old_raw = objects.hold_instance_text(change.old, config.hold_key)
    new_raw = objects.hold_instance_text(change.new, config.hold_key)
    old, new = parse_hold_instance(old_raw), parse_hold_instance(new_raw)
    if old is None or new is None or new >= old:
        return None
    rule = RuleId.HOLD_INSTANCE_MONOTONIC
    return Violation(
        rule,
        f"{_prefix(rule, change)} carries hold instance {old} and this write would lower it "
        f"to {new}; hold instances only grow, so this looks like a stale hold. Hold with an "
        f"instance greater than {old}, or {_release_hint(change, config, old_raw)}.",
        new_raw,
    )


def hold_instance_malformed(change: Change, config: RulesConfig) -> Violation | None:
    """A NEW or CHANGED ``P/hold-instance`` must be canonical decimal in [1, 2^63-1].

    The bound is ``vocabulary.MAX_HOLD_INSTANCE`` (via ``parse_hold_instance``), the one the
    adapter checks before it writes, so "9223372036854775808" is refused here too."""
    new_raw = objects.hold_instance_text(change.new, config.hold_key)
    if new_raw is None or parse_hold_instance(new_raw) is not None:
        return None
    if new_raw == objects.hold_instance_text(change.old, config.hold_key):
        return None  # already stored before; do not wedge the object
    rule = RuleId.HOLD_INSTANCE_MALFORMED
    return Violation(
        rule,
        f'{_prefix(rule, change)}: {config.annotations.hold_instance}="{shown(new_raw)}" is not'
        f" a hold instance; write it as a decimal integer from 1 to {MAX_HOLD_INSTANCE} with "
        f'no sign, spaces or leading zeros (e.g. "3"), or remove the '
        f"{config.annotations.prefix}/hold-* annotations.",
        new_raw,
    )


def hold_owner_only(change: Change, config: RulesConfig) -> Violation | None:
    """Optional (on when ``holder_identities`` is set): only a holder changes a hold.

    Refuses, by anyone who is not a holder (username or a group in ``holder_identities``)
    and not in the break-glass group (``BREAK_GLASS_GROUP``):
      - a write that adds, changes or removes any of the four hold annotations (CREATE with
        one counts as adding it), and
      - a write that sets ``spec.active`` of a Workload carrying any of them back to true.
    Invariant: a write that leaves the four annotations and the Workload's activation as
    they were is never refused here, whoever makes it (so Kueue's writes pass).
    """
    holders = config.holder_identities
    if not holders:
        return None
    keys = config.annotations.hold_keys
    old = [objects.annotation(change.old, key) for key in keys]
    new = [objects.annotation(change.new, key) for key in keys]
    changed = old != new
    reactivated = (
        change.is_workload
        and change.old is not None
        and any(value is not None for value in old)
        and not objects.active(change.old)
        and objects.active(change.new)
    )
    if not (changed or reactivated):
        return None
    if change.username in holders or any(
        group in holders or group == BREAK_GLASS_GROUP for group in change.groups
    ):
        return None
    rule = RuleId.HOLD_OWNER_ONLY
    instance = objects.hold_instance_text(
        change.new, config.hold_key
    ) or objects.hold_instance_text(change.old, config.hold_key)
    what = "reactivate this held Workload" if reactivated and not changed else "change its hold"
    owner = objects.controller_trainjob(change.new) or objects.controller_trainjob(change.old)
    target = f"{change.namespace}/{owner.name}" if owner and change.is_workload else change.ref
    return Violation(
        rule,
        f"{_prefix(rule, change)}: only the holder may place, change or lift a hold, and "
        f"{change.username or 'this writer'} is not in webhook.holderIdentities, so it may "
        f"not {what} (the {config.annotations.prefix}/hold-* annotations"
        f"{', spec.active' if reactivated else ''}). Ask the holder to release it "
        f"(`holdwarden release {target} --instance {parse_hold_instance(instance) or 'N'}`); "
        f"in an emergency a cluster admin in {BREAK_GLASS_GROUP} may (docs/explanation/policy.md, "
        f"break-glass).",
        instance,
    )


Rule = Callable[[Change, RulesConfig], "Violation | None"]


def held_workload_kept(change: Change, config: RulesConfig) -> Violation | None:
    """A Workload carrying ``P/hold-instance`` may be deleted only by
    ``webhook.workloadDeleters`` (the garbage collector, the namespace controller).

    Why: Kueue gives every queued TrainJob a Workload. Delete the held one and Kueue makes
    a fresh one, active and without the hold, and admits the job: the hold is gone without
    anyone lifting it. The garbage collector deletes it only once its TrainJob is gone, and
    the namespace controller only with its namespace; then there is nothing left to run.
    """
    if change.operation != "DELETE" or not change.is_workload:
        return None
    instance = objects.hold_instance_text(change.old, config.hold_key)
    if instance is None:
        return None
    ids = config.workload_deleters
    if change.username in ids or any(group in ids for group in change.groups):
        return None
    rule = RuleId.HELD_WORKLOAD_KEPT
    return Violation(
        rule,
        f"{_prefix(rule, change)} is held ({config.annotations.hold_instance}={shown(instance)}); "
        f"deleting it would drop the hold, since Kueue would create a new, active Workload "
        f"for its TrainJob and run it. To delete it, {_release_hint(change, config, instance)}"
        f"; or delete the TrainJob itself (its Workload goes with it).",
        instance,
    )


# CREATE and UPDATE: these, in this order. DELETE: DELETE_RULE_ORDER only (the others read
# the new object, which a DELETE does not have).
RULE_ORDER: tuple[tuple[RuleId, Rule], ...] = (
    (RuleId.HOLD_INSTANCE_MALFORMED, hold_instance_malformed),
    (RuleId.HOLD_INSTANCE_MONOTONIC, hold_instance_monotonic),
    (RuleId.HELD_TRAINJOB_SUSPENDED, held_trainjob_suspended),
    (RuleId.HELD_WORKLOAD_INACTIVE, held_workload_inactive),
    (RuleId.KUEUE_OWNS_SUSPEND, kueue_owns_suspend),
    (RuleId.HOLD_OWNER_ONLY, hold_owner_only),
)


DELETE_RULE_ORDER: tuple[tuple[RuleId, Rule], ...] = (
    (RuleId.HELD_WORKLOAD_KEPT, held_workload_kept),
)


# The second webhook entry's (``RulesConfig.kueue_managed_namespace``): only the rule whose
# verdict depends on the namespace; the first entry, called for the same write, judges the
# rest.
KUEUE_NAMESPACE_RULE_ORDER: tuple[tuple[RuleId, Rule], ...] = (
    (RuleId.KUEUE_OWNS_SUSPEND, kueue_owns_suspend),
)


def _rules_for(change: Change, config: RulesConfig) -> tuple[tuple[RuleId, Rule], ...]:
    if change.operation == "DELETE":
        return () if config.kueue_managed_namespace else DELETE_RULE_ORDER
    return KUEUE_NAMESPACE_RULE_ORDER if config.kueue_managed_namespace else RULE_ORDER


def violations(change: Change, config: RulesConfig) -> list[Violation]:
    """Every violation, in ``RULE_ORDER``; empty for a request that is not judged."""
    if skip_reason(change) is not None:
        return []
    found = []
    for _, rule in _rules_for(change, config):
        violation = rule(change, config)
        if violation is not None:
            found.append(violation)
    return found


def evaluate(change: Change, config: RulesConfig) -> Violation | None:
    """The first violation in ``RULE_ORDER``, or None when the write is allowed."""
    if skip_reason(change) is not None:
        return None
    for _, rule in _rules_for(change, config):
        violation = rule(change, config)
        if violation is not None:
            return violation
    return None
