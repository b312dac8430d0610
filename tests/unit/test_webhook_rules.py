"""Table tests and properties of the pure rule engine (webhook/rules.py)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.config import Config, KueueConfig
from holdwarden.vocabulary import QUEUE_NAME_LABEL, Annotations, RuleId
from holdwarden.webhook.rules import (
    RULE_ORDER,
    Change,
    RulesConfig,
    evaluate,
    held_trainjob_suspended,
    held_workload_inactive,
    hold_instance_malformed,
    hold_instance_monotonic,
    hold_owner_only,
    kueue_owns_suspend,
    shown,
    skip_reason,
    violations,
)

KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"
CONFIG = RulesConfig.from_config(Config())
A = Annotations()
ABSENT: Any = object()  # marks "field not present"


def obj(
    *,
    suspend: Any = ABSENT,
    active: Any = ABSENT,
    instance: Any = ABSENT,
    queue: bool = False,
    extra_annotations: dict[str, str] | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    annotations: dict[str, Any] = dict(extra_annotations or {})
    if instance is not ABSENT:
        annotations[A.hold_instance] = instance
        annotations[A.hold_reason] = "test"
    meta: dict[str, Any] = {"name": "job", "namespace": "ns", "annotations": annotations}
    if queue:
        meta["labels"] = {QUEUE_NAME_LABEL: "lq"}
    if owner:
        meta["ownerReferences"] = [
            {"kind": "TrainJob", "name": owner, "controller": True, "apiVersion": "x", "uid": "u"}
        ]
    spec: dict[str, Any] = {}
    if suspend is not ABSENT:
        spec["suspend"] = suspend
    if active is not ABSENT:
        spec["active"] = active
    return {"metadata": meta, "spec": spec}


def trainjob(
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    *,
    user: str = "alice",
    groups: tuple[str, ...] = ("system:authenticated",),
    operation: str | None = None,
    subresource: str = "",
) -> Change:
    return Change(
        group="trainer.kubeflow.org",
        resource="trainjobs",
        subresource=subresource,
        operation=operation or ("CREATE" if old is None else "UPDATE"),
        namespace="ns",
        name="job",
        username=user,
        groups=groups,
        old=old,
        new=new,
    )


def workload(
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    *,
    user: str = "alice",
    operation: str | None = None,
    subresource: str = "",
) -> Change:
    return Change(
        group="kueue.x-k8s.io",
        resource="workloads",
        subresource=subresource,
        operation=operation or ("CREATE" if old is None else "UPDATE"),
        namespace="ns",
        name="wl",
        username=user,
        groups=(),
        old=old,
        new=new,
    )


SUSPENDS = (ABSENT, False, True)
ACTIVES = (ABSENT, True, False)
INSTANCES = (ABSENT, "1", "2", "7", "0", "01", "-1", " 3", "x", "")


# --- held-trainjob-suspended -------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_suspend", "new_suspend", "old_instance", "new_instance"),
    list(itertools.product(SUSPENDS, SUSPENDS, INSTANCES, INSTANCES)),
)
def test_held_trainjob_suspended_exhaustive(
    old_suspend: Any, new_suspend: Any, old_instance: Any, new_instance: Any
) -> None:
    change = trainjob(
        obj(suspend=old_suspend, instance=old_instance),
        obj(suspend=new_suspend, instance=new_instance),
    )
    got = held_trainjob_suspended(change, CONFIG)
    # Refused exactly when the new object carries the key (any value) and is not suspended.
    expected = new_instance is not ABSENT and new_suspend is not True
    assert (got is not None) == expected
    if got is not None:
        assert got.rule is RuleId.HELD_TRAINJOB_SUSPENDED
        assert got.instance == new_instance
        assert "ns/job" in got.message and "TrainJob" in got.message
        assert "held-trainjob-suspended" in got.message
        assert "holdwarden.io/hold-*" in got.message


@pytest.mark.parametrize(
    ("suspend", "instance", "refused"),
    [
        (ABSENT, "3", True),
        (False, "3", True),
        (True, "3", False),
        (ABSENT, ABSENT, False),
        (False, ABSENT, False),
        ("true", "3", True),  # only a literal true counts as suspended
    ],
)
def test_held_trainjob_suspended_on_create(suspend: Any, instance: Any, refused: bool) -> None:
    change = trainjob(None, obj(suspend=suspend, instance=instance))
    assert (held_trainjob_suspended(change, CONFIG) is not None) is refused
    assert (evaluate(change, CONFIG) is not None) is refused


def test_held_trainjob_message_says_how_to_release() -> None:
    got = held_trainjob_suspended(
        trainjob(obj(suspend=True, instance="4"), obj(instance="4")), CONFIG
    )
    assert got is not None
    assert "holdwarden release ns/job --instance 4" in got.message
    assert "holdwarden.io/hold-instance=4" in got.message


def test_held_rules_ignore_the_other_kind() -> None:
    assert held_trainjob_suspended(workload(None, obj(instance="1")), CONFIG) is None
    assert held_workload_inactive(trainjob(None, obj(instance="1")), CONFIG) is None


# --- held-workload-inactive --------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_active", "new_active", "old_instance", "new_instance"),
    list(itertools.product(ACTIVES, ACTIVES, INSTANCES, INSTANCES)),
)
def test_held_workload_inactive_exhaustive(
    old_active: Any, new_active: Any, old_instance: Any, new_instance: Any
) -> None:
    change = workload(
        obj(active=old_active, instance=old_instance), obj(active=new_active, instance=new_instance)
    )
    got = held_workload_inactive(change, CONFIG)
    # Absent means active; only a literal false is inactive.
    expected = new_instance is not ABSENT and new_active is not False
    assert (got is not None) == expected
    if got is not None:
        assert got.rule is RuleId.HELD_WORKLOAD_INACTIVE
        assert "Workload ns/wl" in got.message
        assert "held-workload-inactive" in got.message


def test_held_workload_message_names_the_owning_trainjob() -> None:
    change = workload(
        obj(active=False, instance="5", owner="train-1"),
        obj(active=True, instance="5", owner="train-1"),
    )
    got = held_workload_inactive(change, CONFIG)
    assert got is not None
    assert "holdwarden release ns/train-1 --instance 5" in got.message


# --- kueue-owns-suspend ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_suspend", "new_suspend", "old_queue", "new_queue", "user"),
    list(itertools.product(SUSPENDS, SUSPENDS, (False, True), (False, True), ("alice", KUEUE))),
)
def test_kueue_owns_suspend_exhaustive(
    old_suspend: Any, new_suspend: Any, old_queue: bool, new_queue: bool, user: str
) -> None:
    change = trainjob(
        obj(suspend=old_suspend, queue=old_queue),
        obj(suspend=new_suspend, queue=new_queue),
        user=user,
    )
    got = kueue_owns_suspend(change, CONFIG)
    changed = (old_suspend is True) != (new_suspend is True)  # absent == false
    expected = changed and (old_queue or new_queue) and user != KUEUE
    assert (got is not None) == expected
    if got is not None:
        assert got.rule is RuleId.KUEUE_OWNS_SUSPEND
        assert "alice" in got.message and "Kueue" in got.message


def test_kueue_identity_by_group_and_by_config() -> None:
    change = trainjob(
        obj(suspend=True, queue=True), obj(suspend=False, queue=True), user="bob", groups=("kq",)
    )
    assert kueue_owns_suspend(change, CONFIG) is not None
    custom = RulesConfig.from_config(Config(kueue=KueueConfig(identities=("kq",))))
    assert kueue_owns_suspend(change, custom) is None
    # The default identity is no longer Kueue once the config names another.
    as_default = trainjob(obj(suspend=True, queue=True), obj(suspend=False, queue=True), user=KUEUE)
    assert kueue_owns_suspend(as_default, custom) is not None


def test_kueue_owns_suspend_needs_an_old_object() -> None:
    assert kueue_owns_suspend(trainjob(None, obj(suspend=False, queue=True)), CONFIG) is None


# --- hold-instance-monotonic -------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_instance", "new_instance"), list(itertools.product(INSTANCES, INSTANCES))
)
def test_monotonic_exhaustive(old_instance: Any, new_instance: Any) -> None:
    change = workload(
        obj(active=False, instance=old_instance), obj(active=False, instance=new_instance)
    )
    got = hold_instance_monotonic(change, CONFIG)
    valid = {"1": 1, "2": 2, "7": 7}
    expected = (
        old_instance in valid
        and new_instance in valid
        and valid[new_instance] < valid[old_instance]
    )
    assert (got is not None) == expected
    if got is not None:
        assert got.rule is RuleId.HOLD_INSTANCE_MONOTONIC
        assert got.instance == new_instance
        assert f"instance {old_instance}" in got.message


def test_monotonic_compares_numbers_not_strings() -> None:
    change = trainjob(obj(suspend=True, instance="10"), obj(suspend=True, instance="9"))
    assert hold_instance_monotonic(change, CONFIG) is not None
    change = trainjob(obj(suspend=True, instance="9"), obj(suspend=True, instance="10"))
    assert hold_instance_monotonic(change, CONFIG) is None


# --- hold-instance-malformed -------------------------------------------------------------


@pytest.mark.parametrize(
    ("old_instance", "new_instance"), list(itertools.product(INSTANCES, INSTANCES))
)
def test_malformed_exhaustive(old_instance: Any, new_instance: Any) -> None:
    change = trainjob(
        obj(suspend=True, instance=old_instance), obj(suspend=True, instance=new_instance)
    )
    got = hold_instance_malformed(change, CONFIG)
    malformed = new_instance is not ABSENT and new_instance not in ("1", "2", "7")
    expected = malformed and new_instance != old_instance
    assert (got is not None) == expected
    if got is not None:
        assert got.rule is RuleId.HOLD_INSTANCE_MALFORMED
        assert f'{A.hold_instance}="{new_instance}" is not a hold instance' in got.message


@pytest.mark.parametrize(
    ("value", "seen"),
    [
        ("x", "x"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),  # one refusal, one line
        ("back\\slash", "back\\\\slash"),
        ("9" * 64, "9" * 64),
        ("9" * 65, "9" * 64 + "..."),
    ],
)
def test_a_value_is_shown_cut_and_escaped_as_the_policy_shows_it(value: str, seen: str) -> None:
    assert shown(value) == seen


MALFORMED = ["0", "01", "-1", "+1", "1.0", "1e3", " 1", "1 ", "", "x", "\u0661"]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_on_create(value: str) -> None:
    got = evaluate(trainjob(None, obj(suspend=True, instance=value)), CONFIG)
    assert got is not None and got.rule is RuleId.HOLD_INSTANCE_MALFORMED


def test_stored_garbage_does_not_wedge_the_object() -> None:
    old = obj(suspend=True, instance="01", extra_annotations={"other": "a"})
    new = obj(suspend=True, instance="01", extra_annotations={"other": "b"})
    assert evaluate(trainjob(old, new), CONFIG) is None


def test_custom_prefix() -> None:
    config = RulesConfig.from_config(Config(annotation_prefix="example.com"))
    new = {"metadata": {"annotations": {"example.com/hold-instance": "1"}}, "spec": {}}
    got = evaluate(trainjob(None, new), config)
    assert got is not None and got.rule is RuleId.HELD_TRAINJOB_SUSPENDED
    assert "example.com/hold-*" in got.message
    assert evaluate(trainjob(None, obj(instance="1")), config) is None  # other prefix: not ours


# --- which requests are judged, and the order ---------------------------------------------


@pytest.mark.parametrize(
    ("change", "judged"),
    [
        (trainjob(obj(), obj()), True),
        (trainjob(None, obj()), True),
        (workload(obj(), obj()), True),
        (trainjob(obj(), obj(), subresource="status"), False),
        (workload(obj(), obj(), subresource="status"), False),
        (trainjob(obj(), None, operation="DELETE"), False),
        (trainjob(None, None, operation="CONNECT"), False),
        (
            Change("", "pods", "", "UPDATE", "ns", "p", "u", (), obj(), obj(instance="x")),
            False,
        ),
        (
            # same plural, wrong group: not ours
            Change(
                "other.io", "trainjobs", "", "UPDATE", "ns", "p", "u", (), obj(), obj(instance="x")
            ),
            False,
        ),
    ],
)
def test_skip_reason(change: Change, judged: bool) -> None:
    assert (skip_reason(change) is None) is judged
    if not judged:
        assert evaluate(change, CONFIG) is None
        assert violations(change, CONFIG) == []


def test_first_violation_follows_rule_order() -> None:
    # Garbled, lowered-looking, unsuspended and Kueue-managed all at once.
    change = trainjob(
        obj(suspend=True, instance="5", queue=True), obj(suspend=False, instance="05", queue=True)
    )
    found = violations(change, CONFIG)
    assert [v.rule for v in found] == [
        RuleId.HOLD_INSTANCE_MALFORMED,
        RuleId.HELD_TRAINJOB_SUSPENDED,
        RuleId.KUEUE_OWNS_SUSPEND,
    ]
    first = evaluate(change, CONFIG)
    assert first is not None and first.rule is RuleId.HOLD_INSTANCE_MALFORMED
    assert [rule for rule, _ in RULE_ORDER] == [
        RuleId.HOLD_INSTANCE_MALFORMED,
        RuleId.HOLD_INSTANCE_MONOTONIC,
        RuleId.HELD_TRAINJOB_SUSPENDED,
        RuleId.HELD_WORKLOAD_INACTIVE,
        RuleId.KUEUE_OWNS_SUSPEND,
        RuleId.HOLD_OWNER_ONLY,
    ]


def test_rules_survive_odd_shapes() -> None:
    odd: list[Any] = [
        {},
        {"metadata": None, "spec": None},
        {"metadata": {"annotations": None, "labels": []}, "spec": []},
        {"metadata": {"annotations": {A.hold_instance: 3}}, "spec": {"suspend": "yes"}},
        {"metadata": {"ownerReferences": [None, {"kind": "TrainJob"}]}},
    ]
    for old, new in itertools.product([None, *odd], odd):
        for change in (trainjob(old, new), workload(old, new)):
            evaluate(change, CONFIG)
            violations(change, CONFIG)
    got = evaluate(trainjob(None, odd[3]), CONFIG)
    assert got is not None and got.rule is RuleId.HOLD_INSTANCE_MALFORMED


# --- properties ----------------------------------------------------------------------------

values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
instances = st.one_of(st.just(ABSENT), st.text(max_size=4), st.integers(1, 30).map(str))


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    return obj(
        suspend=draw(st.one_of(st.just(ABSENT), values)),
        active=draw(st.one_of(st.just(ABSENT), values)),
        instance=draw(instances),
        queue=draw(st.booleans()),
    )


def strip_hold(o: dict[str, Any]) -> dict[str, Any]:
    annotations = {k: v for k, v in o["metadata"]["annotations"].items() if k not in A.hold_keys}
    return {**o, "metadata": {**o["metadata"], "annotations": annotations}}


users = st.sampled_from(["alice", KUEUE, "system:serviceaccount:x:y"])


@given(old=st.one_of(st.none(), objects()), new=objects(), user=users, kind=st.booleans())
def test_removing_all_hold_annotations_never_trips_hold_rules(
    old: dict[str, Any] | None, new: dict[str, Any], user: str, kind: bool
) -> None:
    change = (trainjob if kind else workload)(old, strip_hold(new), user=user)
    rules = {v.rule for v in violations(change, CONFIG)}
    assert rules <= {RuleId.KUEUE_OWNS_SUSPEND}


@given(
    old=objects(),
    new=objects(),
    user=users,
    kind=st.booleans(),
    sub=st.sampled_from(["status", "scale", "x"]),
)
def test_subresource_writes_are_never_refused(
    old: dict[str, Any], new: dict[str, Any], user: str, kind: bool, sub: str
) -> None:
    change = (trainjob if kind else workload)(old, new, user=user, subresource=sub)
    assert evaluate(change, CONFIG) is None


@given(old=st.one_of(st.none(), objects()), new=objects(), user=users, kind=st.booleans())
def test_evaluate_is_deterministic_and_agrees_with_violations(
    old: dict[str, Any] | None, new: dict[str, Any], user: str, kind: bool
) -> None:
    change = (trainjob if kind else workload)(old, new, user=user)
    first, again, every = (
        evaluate(change, CONFIG),
        evaluate(change, CONFIG),
        violations(change, CONFIG),
    )
    assert first == again
    assert first == (every[0] if every else None)


@given(old=objects(), new=objects(), kind=st.booleans())
def test_kueue_identity_is_never_refused_for_suspend_alone(
    old: dict[str, Any], new: dict[str, Any], kind: bool
) -> None:
    change = (trainjob if kind else workload)(old, new, user=KUEUE)
    assert all(v.rule is not RuleId.KUEUE_OWNS_SUSPEND for v in violations(change, CONFIG))


@given(old=objects(), new=objects())
def test_an_unchanged_object_is_never_refused_by_change_rules(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    # A no-op update (new == old) can only be refused by the held-* state rules.
    for change in (trainjob(old, old), workload(old, old)):
        rules = {v.rule for v in violations(change, CONFIG)}
        assert rules <= {RuleId.HELD_TRAINJOB_SUSPENDED, RuleId.HELD_WORKLOAD_INACTIVE}


# --- hold-owner-only (optional) ----------------------------------------------------------

SUPERVISOR = "system:serviceaccount:holdwarden-system:dispatch"
OWNED = RulesConfig(A, frozenset({KUEUE}), frozenset({SUPERVISOR, "holders"}))
HOLD = {A.hold_reason: "r", A.held_at: "2026-12-02T12:00:00Z", A.held_by: "dispatch"}


def owned(change: Change) -> RuleId | None:
    found = hold_owner_only(change, OWNED)
    return found.rule if found is not None else None


def test_hold_owner_only_is_off_without_holders() -> None:
    lift = trainjob(obj(suspend=True, instance="3"), obj(suspend=False))
    assert hold_owner_only(lift, CONFIG) is None
    assert evaluate(lift, CONFIG) is None  # the spec allows a one-write lift by anyone


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (obj(suspend=True, instance="3"), obj(suspend=False)),  # lift a hold
        (obj(suspend=True, instance="3"), obj(suspend=True)),  # first write of a lowering
        (obj(suspend=True), obj(suspend=True, instance="1")),  # place a hold
        (obj(suspend=True, instance="3"), obj(suspend=True, instance="4")),  # change it
        (obj(suspend=True, instance="3", extra_annotations=HOLD),
         obj(suspend=True, instance="3")),  # drop held-at/held-by: still a change
        (obj(suspend=True, extra_annotations=HOLD), obj(suspend=True)),  # partial hold
    ],
)  # fmt: skip
def test_hold_owner_only_refuses_changes_by_non_holders(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    for user, groups in (("alice", ("system:authenticated",)), (KUEUE, ())):
        assert owned(trainjob(old, new, user=user, groups=groups)) == RuleId.HOLD_OWNER_ONLY
    assert owned(trainjob(old, new, user=SUPERVISOR)) is None
    assert owned(trainjob(old, new, user="bob", groups=("holders",))) is None  # by group
    assert owned(trainjob(old, new, user="oncall", groups=("system:masters",))) is None


def test_hold_owner_only_refuses_reactivating_a_held_workload() -> None:
    held = obj(active=False, instance="2", owner="tj")
    message = hold_owner_only(workload(held, obj(active=True, instance="2", owner="tj")), OWNED)
    assert message is not None and "reactivate" in message.message
    assert "holdwarden release ns/tj --instance 2" in message.message
    partial = obj(active=False, extra_annotations=HOLD)
    assert owned(workload(partial, obj(active=True, extra_annotations=HOLD))) is not None
    assert owned(workload(held, obj(active=True, instance="2"), user=SUPERVISOR)) is None
    # An unheld Workload stays anyone's to reactivate.
    assert owned(workload(obj(active=False), obj(active=True))) is None


def test_hold_owner_only_lets_writes_that_keep_the_hold_pass() -> None:
    held = obj(suspend=True, instance="3", queue=True, extra_annotations=HOLD)
    relabelled = obj(suspend=True, instance="3", queue=True, extra_annotations=HOLD)
    relabelled["metadata"]["labels"]["team"] = "a"
    for user in ("alice", KUEUE):
        assert owned(trainjob(held, relabelled, user=user)) is None
    wl = obj(active=False, instance="3", extra_annotations=HOLD)
    assert owned(workload(wl, obj(active=False, instance="3", extra_annotations=HOLD),
                          user=KUEUE)) is None  # fmt: skip
    # P/opened and P/attempt are not hold annotations.
    opened = obj(suspend=True, instance="3", extra_annotations={A.opened: "t", A.attempt: "2"})
    assert owned(trainjob(obj(suspend=True, instance="3"), opened)) is None


def test_hold_owner_only_runs_last_and_only_with_holders() -> None:
    assert RULE_ORDER[-1][0] == RuleId.HOLD_OWNER_ONLY
    lower = trainjob(obj(suspend=True, instance="5"), obj(suspend=True, instance="2"))
    assert [v.rule for v in violations(lower, OWNED)] == [
        RuleId.HOLD_INSTANCE_MONOTONIC,
        RuleId.HOLD_OWNER_ONLY,
    ]
    assert [v.rule for v in violations(lower, CONFIG)] == [RuleId.HOLD_INSTANCE_MONOTONIC]
    config = RulesConfig.from_config(
        Config.from_dict({"webhook": {"holderIdentities": [SUPERVISOR]}})
    )
    assert config.holder_identities == frozenset({SUPERVISOR})


# --- held-workload-kept (DELETE) ----------------------------------------------------------

GC = "system:serviceaccount:kube-system:generic-garbage-collector"
NS_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"


@pytest.mark.parametrize(
    ("instance", "user", "refused"),
    [
        pytest.param("3", "alice", True, id="held-by-a-user"),
        pytest.param("3", KUEUE, True, id="held-by-kueue"),
        pytest.param("x", "alice", True, id="garbled-hold-is-a-hold"),
        pytest.param("3", GC, False, id="held-by-the-garbage-collector"),
        pytest.param("3", NS_CONTROLLER, False, id="held-by-the-namespace-controller"),
        pytest.param("3", "system:kube-controller-manager", False, id="held-by-kcm"),
        pytest.param(ABSENT, "alice", False, id="not-held"),
    ],
)
def test_held_workload_kept_refuses_deleting_a_held_workload(
    instance: Any, user: str, refused: bool
) -> None:
    """Deleting a held Workload drops the hold: Kueue makes a fresh, active one and runs
    the job. Only the garbage collector and the namespace controller may."""
    change = workload(
        obj(active=False, instance=instance, owner="job"), None, user=user, operation="DELETE"
    )
    got = evaluate(change, CONFIG)
    assert (got is not None) is refused
    if got is not None:
        assert got.rule is RuleId.HELD_WORKLOAD_KEPT
        assert "holdwarden release ns/job" in got.message
        assert "delete the TrainJob itself" in got.message
    # The other rules never judge a DELETE, whatever the old object says.
    assert [v.rule for v in violations(change, CONFIG)] == (
        [RuleId.HELD_WORKLOAD_KEPT] if refused else []
    )


def test_deleting_a_trainjob_is_not_judged() -> None:
    change = trainjob(obj(suspend=False, instance="3", queue=True), None, operation="DELETE")
    assert skip_reason(change) is not None
    assert evaluate(change, CONFIG) is None


def test_workload_deleters_are_configurable() -> None:
    only_gc = RulesConfig(A, frozenset({KUEUE}), workload_deleters=frozenset({GC}))
    change = workload(obj(instance="3"), None, user=NS_CONTROLLER, operation="DELETE")
    assert evaluate(change, only_gc) is not None
    assert evaluate(change, CONFIG) is None


# --- Kueue's manageJobsWithoutQueueName: the second webhook entry's requests ---------------

QUEUELESS = dataclasses.replace(CONFIG, kueue_managed_namespace=True)


@pytest.mark.parametrize(
    ("old_suspend", "new_suspend", "queue", "user", "refused"),
    [
        (True, False, False, "alice", True),  # a person unsuspends a queueless TrainJob
        (ABSENT, True, False, "alice", True),  # or suspends it
        (True, False, True, "alice", True),  # labelled: Kueue's anyway
        (True, False, False, KUEUE, False),  # Kueue itself
        (True, True, False, "alice", False),  # no change of spec.suspend
        (ABSENT, False, False, "alice", False),  # absent counts as false: no change
    ],
)
def test_kueue_owns_suspend_of_a_queueless_trainjob_on_the_second_entry(
    old_suspend: Any, new_suspend: Any, queue: bool, user: str, refused: bool
) -> None:
    change = trainjob(
        obj(suspend=old_suspend, queue=queue), obj(suspend=new_suspend, queue=queue), user=user
    )
    violation = evaluate(change, QUEUELESS)
    assert (violation is not None) is refused
    if violation is not None:
        assert violation.rule is RuleId.KUEUE_OWNS_SUSPEND
        why = f"label {QUEUE_NAME_LABEL}" if queue else "namespace 'ns' is one Kueue's"
        assert why in violation.message


def test_a_queueless_trainjob_is_not_kueues_on_the_first_entry() -> None:
    change = trainjob(obj(suspend=True), obj(suspend=False))
    assert kueue_owns_suspend(change, CONFIG) is None
    assert kueue_owns_suspend(change, QUEUELESS) is not None


def test_the_second_entry_judges_only_kueue_owns_suspend() -> None:
    # A held queueless TrainJob unsuspended: the first entry refuses it as
    # held-trainjob-suspended; the second must not refuse (and audit) it a second time
    # by that rule, only by kueue-owns-suspend.
    change = trainjob(obj(suspend=True, instance="3"), obj(suspend=False, instance="3"))
    assert evaluate(change, CONFIG) is not None
    assert evaluate(change, CONFIG).rule is RuleId.HELD_TRAINJOB_SUSPENDED  # type: ignore[union-attr]
    assert [v.rule for v in violations(change, QUEUELESS)] == [RuleId.KUEUE_OWNS_SUSPEND]
    # Workloads and DELETEs are never the second entry's.
    assert (
        evaluate(
            workload(obj(active=False, instance="3"), obj(active=True, instance="3")), QUEUELESS
        )
        is None
    )
    held = obj(active=False, instance="3")
    assert evaluate(workload(held, None, operation="DELETE"), QUEUELESS) is None


@given(old=st.one_of(st.none(), objects()), new=objects(), user=users, kind=st.booleans())
def test_the_second_entry_refuses_only_what_kueue_owns_suspend_refuses_with_the_label(
    old: dict[str, Any] | None, new: dict[str, Any], user: str, kind: bool
) -> None:
    # On the second entry an unlabelled TrainJob is judged exactly as the same TrainJob
    # carrying the label is judged by kueue-owns-suspend on the first.
    def labelled(o: dict[str, Any] | None) -> dict[str, Any] | None:
        if o is None:
            return None
        meta = {**o["metadata"], "labels": {QUEUE_NAME_LABEL: "lq"}}
        return {**o, "metadata": meta}

    make = trainjob if kind else workload
    found = evaluate(make(old, new, user=user), QUEUELESS)
    expected = kueue_owns_suspend(make(labelled(old), labelled(new), user=user), CONFIG)
    if not kind:
        expected = None
    assert (found is None) is (expected is None)
    assert found is None or found.rule is RuleId.KUEUE_OWNS_SUSPEND
