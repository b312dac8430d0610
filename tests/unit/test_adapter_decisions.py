"""Table tests and properties of the adapter's pure decisions (no I/O)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden.adapter.decisions import (
    Decision,
    Outcome,
    classify,
    decide_hold,
    decide_open,
    decide_release,
    kueue_cause,
    leftover_pods,
    needs_namespace_for_start,
    pod_check_carries_over,
    release_would_unsuspend,
    validate_start_body,
)
from holdwarden.adapter.types import Ref, State
from holdwarden.objects import cluster_queue_admission_checks, format_time, parse_attempt
from holdwarden.vocabulary import JOB_UID_LABEL, QUEUE_NAME_LABEL, Annotations

A = Annotations("holdwarden.io")
NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
REF = Ref("ns", "job")
HOLDER = "dispatch"


def obj(
    *,
    kind: str = "TrainJob",
    ann: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "x/v1",
        "kind": kind,
        "metadata": {"name": "job", "namespace": "ns", "resourceVersion": "42", "uid": "u1"},
        "spec": dict(spec or {}),
    }
    if ann is not None:
        body["metadata"]["annotations"] = dict(ann)
    if conditions is not None:
        body["status"] = {"conditions": conditions}
    return body


def held_ann(instance: str) -> dict[str, str]:
    return {
        A.hold_instance: instance,
        A.hold_reason: "r",
        A.held_at: "2026-01-01T00:00:00Z",
        A.held_by: HOLDER,
    }


def cond(type_: str, status: str = "True", reason: str = "R") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def hold(o: dict[str, Any], mode: str, m: int, **kw: Any) -> Decision:
    return decide_hold(
        o,
        mode=mode,  # type: ignore[arg-type]
        instance=m,
        reason="node lost",
        holder=HOLDER,
        now=NOW,
        annotations=A,
        **kw,
    )


# ---- Hold ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "spec", "ann", "m", "kw", "expected"),
    [
        # no hold in force: write
        pytest.param("kueue", {}, None, 1, {}, Outcome.WRITE, id="kueue-no-hold-writes"),
        pytest.param(
            "plain", {"suspend": False}, None, 1, {}, Outcome.WRITE, id="plain-no-hold-writes"
        ),
        # same instance in force (field set): an earlier try landed / idempotent
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("3"),
            3,
            {},
            Outcome.DONE,
            id="kueue-same-instance-in-force-is-done",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("3"),
            3,
            {},
            Outcome.DONE,
            id="plain-same-instance-in-force-is-done",
        ),
        # same instance annotated but hold field not set (no enforcer): re-assert
        pytest.param(
            "kueue",
            {"active": True},
            held_ann("3"),
            3,
            {},
            Outcome.WRITE,
            id="kueue-same-instance-field-unset-reasserts",
        ),
        pytest.param(
            "plain",
            {"suspend": False},
            held_ann("3"),
            3,
            {},
            Outcome.WRITE,
            id="plain-same-instance-field-unset-reasserts",
        ),
        # older instance in force on the first read: a newer hold supersedes
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("2"),
            3,
            {},
            Outcome.WRITE,
            id="kueue-older-instance-in-force-is-superseded",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("2"),
            3,
            {},
            Outcome.WRITE,
            id="plain-older-instance-in-force-is-superseded",
        ),
        # newer instance in force: stale, first read or after a conflict
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("4"),
            3,
            {},
            Outcome.STALE,
            id="kueue-newer-instance-in-force-is-stale",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("4"),
            3,
            {},
            Outcome.STALE,
            id="plain-newer-instance-in-force-is-stale",
        ),
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("4"),
            3,
            {"after_conflict": True, "last_seen_instance": "4"},
            Outcome.STALE,
            id="kueue-newer-instance-in-force-after-conflict-is-stale",
        ),
        # after a conflict: same instance seen as before -> some other writer: retry
        pytest.param(
            "kueue",
            {},
            None,
            3,
            {"after_conflict": True, "last_seen_instance": None},
            Outcome.WRITE,
            id="kueue-after-conflict-no-hold-as-before-retries",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("2"),
            3,
            {"after_conflict": True, "last_seen_instance": "2"},
            Outcome.WRITE,
            id="plain-after-conflict-same-instance-as-before-retries",
        ),
        # after a conflict: an instance other than the one the last read saw -> stale
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("2"),
            3,
            {"after_conflict": True, "last_seen_instance": None},
            Outcome.STALE,
            id="kueue-after-conflict-instance-appeared-is-stale",
        ),
        pytest.param(
            "plain",
            {"suspend": False},
            None,
            3,
            {"after_conflict": True, "last_seen_instance": "2"},
            Outcome.STALE,
            id="plain-after-conflict-instance-gone-is-stale",
        ),
        # after a conflict: our own instance now in force -> success
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("3"),
            3,
            {"after_conflict": True, "last_seen_instance": None},
            Outcome.DONE,
            id="kueue-after-conflict-own-instance-in-force-is-done",
        ),
        # malformed instance: overwritten on a first read
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("01"),
            3,
            {},
            Outcome.WRITE,
            id="kueue-malformed-leading-zero-overwritten-on-first-read",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("x"),
            3,
            {},
            Outcome.WRITE,
            id="plain-malformed-text-overwritten-on-first-read",
        ),
        # ...and after a conflict only if the previous read saw the same text
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("x"),
            3,
            {"after_conflict": True, "last_seen_instance": "x"},
            Outcome.WRITE,
            id="kueue-malformed-after-conflict-same-text-overwrites",
        ),
        pytest.param(
            "kueue",
            {"active": False},
            held_ann("x"),
            3,
            {"after_conflict": True, "last_seen_instance": "y"},
            Outcome.STALE,
            id="kueue-malformed-after-conflict-other-text-is-stale",
        ),
        # invalid calls
        pytest.param(
            "kueue", {}, None, 0, {}, Outcome.INVALID, id="kueue-instance-zero-is-invalid"
        ),
        pytest.param(
            "plain", {}, None, -1, {}, Outcome.INVALID, id="plain-negative-instance-is-invalid"
        ),
    ],
)
def test_hold_table(
    mode: str,
    spec: dict[str, Any],
    ann: dict[str, str] | None,
    m: int,
    kw: dict[str, Any],
    expected: Outcome,
) -> None:
    decision = hold(obj(spec=spec, ann=ann), mode, m, **kw)
    assert decision.outcome is expected, decision.detail


def test_hold_write_body_kueue() -> None:
    read = obj(kind="Workload", spec={"active": True, "podSets": []}, ann={"other": "keep"})
    d = hold(read, "kueue", 7)
    assert d.body is not None
    assert d.body["spec"] == {"active": False, "podSets": []}
    assert d.body["metadata"]["annotations"] == {
        "other": "keep",
        A.hold_instance: "7",
        A.hold_reason: "node lost",
        A.held_at: "2026-12-02T12:00:00Z",
        A.held_by: HOLDER,
    }
    assert d.body["metadata"]["resourceVersion"] == "42"
    assert read["spec"]["active"] is True, "the read object is not mutated"


def test_hold_write_body_plain() -> None:
    d = hold(obj(spec={"suspend": False, "runtimeRef": {"name": "r"}}), "plain", 2)
    assert d.body is not None
    assert d.body["spec"] == {"suspend": True, "runtimeRef": {"name": "r"}}
    assert d.body["metadata"]["annotations"][A.hold_instance] == "2"


def test_hold_rejects_overlong_reason() -> None:
    d = decide_hold(
        obj(),
        mode="kueue",
        instance=1,
        reason="x" * 2000,
        holder=HOLDER,
        now=NOW,
        annotations=A,
    )
    assert d.outcome is Outcome.INVALID


def test_decision_body_iff_write() -> None:
    with pytest.raises(ValueError):
        Decision(Outcome.WRITE)
    with pytest.raises(ValueError):
        Decision(Outcome.DONE, body={})


# ---- Release -------------------------------------------------------------------------


def release(o: dict[str, Any], mode: str, m: int, pods: bool | None = None) -> Decision:
    return decide_release(o, mode=mode, instance=m, annotations=A, pods_remain=pods)  # type: ignore[arg-type]


OPENED = {A.opened: "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("mode", "ann", "conds", "pods", "expected", "suspend_after", "attempt_after"),
    [
        # instance in force
        pytest.param(
            "kueue",
            held_ann("3"),
            None,
            None,
            Outcome.WRITE,
            None,
            None,
            id="kueue-instance-in-force-writes",
        ),
        # other instance, none, or malformed -> stale
        pytest.param(
            "kueue",
            held_ann("4"),
            None,
            None,
            Outcome.STALE,
            None,
            None,
            id="kueue-newer-instance-is-stale",
        ),
        pytest.param(
            "kueue",
            held_ann("2"),
            None,
            None,
            Outcome.STALE,
            None,
            None,
            id="kueue-older-instance-is-stale",
        ),
        pytest.param(
            "kueue", None, None, None, Outcome.STALE, None, None, id="kueue-no-annotations-is-stale"
        ),
        pytest.param(
            "kueue",
            held_ann("03"),
            None,
            None,
            Outcome.STALE,
            None,
            None,
            id="kueue-malformed-instance-is-stale",
        ),
        pytest.param(
            "plain",
            held_ann("4"),
            None,
            None,
            Outcome.STALE,
            None,
            None,
            id="plain-other-instance-is-stale",
        ),
        pytest.param(
            "plain", {}, None, None, Outcome.STALE, None, None, id="plain-no-hold-is-stale"
        ),
        # plain, held before opened: stays suspended, no attempt
        pytest.param(
            "plain",
            held_ann("3"),
            None,
            None,
            Outcome.WRITE,
            True,
            None,
            id="plain-held-before-opened-stays-suspended-no-attempt",
        ),
        # plain, opened, not ended, no pods: unsuspend and A+1
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED},
            None,
            False,
            Outcome.WRITE,
            False,
            "1",
            id="plain-opened-no-pods-unsuspends-attempt-1",
        ),
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED, A.attempt: "4"},
            None,
            False,
            Outcome.WRITE,
            False,
            "5",
            id="plain-opened-no-pods-unsuspends-attempt-4-to-5",
        ),
        # plain, opened, pods remain: nothing written
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED},
            None,
            True,
            Outcome.PODS_REMAIN,
            None,
            None,
            id="plain-opened-pods-remain-writes-nothing",
        ),
        # plain, opened but ended: stays suspended
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED},
            [cond("Complete")],
            None,
            Outcome.WRITE,
            True,
            None,
            id="plain-opened-complete-stays-suspended",
        ),
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED, A.attempt: "2"},
            [cond("Failed")],
            None,
            Outcome.WRITE,
            True,
            "2",
            id="plain-opened-failed-stays-suspended-keeps-attempt",
        ),
        # a False Complete condition is not ended
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED},
            [cond("Complete", "False")],
            False,
            Outcome.WRITE,
            False,
            "1",
            id="plain-false-complete-is-not-ended",
        ),
        # two Complete conditions, one True: ended (Hypothesis found Release running it)
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED},
            [cond("Complete", "False"), cond("Complete")],
            False,
            Outcome.WRITE,
            True,
            None,
            id="plain-duplicate-complete-one-true-stays-suspended",
        ),
        # garbled attempt: refuse rather than guess A
        pytest.param(
            "plain",
            {**held_ann("3"), **OPENED, A.attempt: "two"},
            None,
            False,
            Outcome.REJECTED,
            None,
            None,
            id="plain-garbled-attempt-is-rejected",
        ),
    ],
)
def test_release_table(
    mode: str,
    ann: dict[str, str] | None,
    conds: list[dict[str, Any]] | None,
    pods: bool | None,
    expected: Outcome,
    suspend_after: bool | None,
    attempt_after: str | None,
) -> None:
    spec = {"active": False} if mode == "kueue" else {"suspend": True}
    d = release(obj(spec=spec, ann=ann, conditions=conds), mode, 3, pods)
    assert d.outcome is expected, d.detail
    if expected is not Outcome.WRITE:
        assert d.body is None
        return
    assert d.body is not None
    written = d.body["metadata"]["annotations"]
    assert not set(A.hold_keys) & set(written)
    if mode == "kueue":
        assert d.body["spec"] == {"active": True}
    else:
        assert d.body["spec"]["suspend"] is suspend_after
        assert written.get(A.attempt) == attempt_after


def test_release_of_opened_plain_needs_the_pod_check() -> None:
    with pytest.raises(ValueError):
        release(obj(spec={"suspend": True}, ann={**held_ann("3"), **OPENED}), "plain", 3, None)


def test_release_would_unsuspend() -> None:
    assert release_would_unsuspend(obj(ann=OPENED), A)
    assert not release_would_unsuspend(obj(ann={}), A)
    assert not release_would_unsuspend(obj(ann=OPENED, conditions=[cond("Failed")]), A)


# ---- Open ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "spec", "ann", "conds", "expected", "suspend_after", "attempt_after"),
    [
        # at the start gate: open and run (plain)
        pytest.param(
            "plain",
            {"suspend": True},
            None,
            None,
            Outcome.WRITE,
            False,
            "1",
            id="plain-at-start-gate-opens-and-runs",
        ),
        # held (any value): opened mark only, stays suspended
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("2"),
            None,
            Outcome.WRITE,
            True,
            None,
            id="plain-held-marks-only",
        ),
        pytest.param(
            "plain",
            {"suspend": True},
            held_ann("bad"),
            None,
            Outcome.WRITE,
            True,
            None,
            id="plain-held-garbled-instance-marks-only",
        ),
        # ended: mark only
        pytest.param(
            "plain",
            {"suspend": True},
            None,
            [cond("Complete")],
            Outcome.WRITE,
            True,
            None,
            id="plain-ended-marks-only",
        ),
        # not suspended (not created by Start): mark only
        pytest.param(
            "plain",
            {"suspend": False},
            None,
            None,
            Outcome.WRITE,
            False,
            None,
            id="plain-not-suspended-marks-only",
        ),
        # already opened: idempotent, nothing written (even if suspended by someone)
        pytest.param(
            "plain",
            {"suspend": True},
            OPENED,
            None,
            Outcome.DONE,
            None,
            None,
            id="plain-already-opened-is-done",
        ),
        pytest.param(
            "kueue",
            {"suspend": True},
            OPENED,
            None,
            Outcome.DONE,
            None,
            None,
            id="kueue-already-opened-is-done",
        ),
        # Kueue mode: only the mark, never spec.suspend
        pytest.param(
            "kueue",
            {"suspend": True},
            None,
            None,
            Outcome.WRITE,
            True,
            None,
            id="kueue-suspended-marks-only-never-suspend",
        ),
        pytest.param(
            "kueue",
            {},
            None,
            None,
            Outcome.WRITE,
            "absent",
            None,
            id="kueue-no-suspend-field-marks-only",
        ),
        # garbled attempt at the gate
        pytest.param(
            "plain",
            {"suspend": True},
            {A.attempt: "-1"},
            None,
            Outcome.REJECTED,
            None,
            None,
            id="plain-garbled-attempt-at-gate-is-rejected",
        ),
    ],
)
def test_open_table(
    mode: str,
    spec: dict[str, Any],
    ann: dict[str, str] | None,
    conds: list[dict[str, Any]] | None,
    expected: Outcome,
    suspend_after: bool | str | None,
    attempt_after: str | None,
) -> None:
    read = obj(spec=spec, ann=ann, conditions=conds)
    d = decide_open(read, mode=mode, now=NOW, annotations=A)  # type: ignore[arg-type]
    assert d.outcome is expected, d.detail
    if d.body is None:
        return
    written = d.body["metadata"]["annotations"]
    assert written[A.opened] == "2026-12-02T12:00:00Z"
    if suspend_after == "absent":
        assert "suspend" not in d.body["spec"]
    else:
        assert d.body["spec"]["suspend"] is suspend_after
    assert written.get(A.attempt) == attempt_after
    # Open never touches the hold annotations
    for key in A.hold_keys:
        assert written.get(key) == (ann or {}).get(key)


# ---- classify ------------------------------------------------------------------------


def tj(
    *, suspend: bool = True, ann: dict[str, str] | None = None, conds: list[Any] | None = None
) -> dict[str, Any]:
    return obj(spec={"suspend": suspend}, ann=ann, conditions=conds)


def wl(
    *, active: bool | None = True, ann: dict[str, str] | None = None, conds: list[Any] | None = None
) -> dict[str, Any]:
    spec = {} if active is None else {"active": active}
    o = obj(kind="Workload", spec=spec, ann=ann, conditions=conds)
    o["metadata"]["name"] = "wl"
    o["metadata"]["labels"] = {JOB_UID_LABEL: "u1"}
    return o


@pytest.mark.parametrize(
    ("trainjob", "workload", "state", "cause"),
    [
        # held by us
        pytest.param(
            tj(ann=OPENED), wl(active=False, ann=held_ann("2")), State.HELD, None, id="held-by-us"
        ),
        # held by us while Kueue also reports a cause: still ours
        pytest.param(
            tj(ann=OPENED),
            wl(
                active=False,
                ann=held_ann("2"),
                conds=[cond("Evicted", reason="DeactivatedDueToAdmissionCheck")],
            ),
            State.HELD,
            "AdmissionCheck",
            id="held-by-us-while-kueue-reports-a-cause",
        ),
        # Kueue's own deactivations, by reason
        pytest.param(
            tj(ann=OPENED),
            wl(
                active=False,
                conds=[cond("Evicted", reason="DeactivatedDueToMaximumExecutionTimeExceeded")],
            ),
            State.DEACTIVATED_BY_KUEUE,
            "MaximumExecutionTimeExceeded",
            id="kueue-deactivated-max-execution-time",
        ),
        pytest.param(
            tj(ann=OPENED),
            wl(
                active=False,
                conds=[cond("Evicted", reason="DeactivatedDueToRequeuingLimitExceeded")],
            ),
            State.DEACTIVATED_BY_KUEUE,
            "RequeuingLimitExceeded",
            id="kueue-deactivated-requeuing-limit",
        ),
        # DeactivationTarget in progress (still active=true)
        pytest.param(
            tj(suspend=False, ann=OPENED),
            wl(active=True, conds=[cond("DeactivationTarget", reason="RequeuingLimitExceeded")]),
            State.DEACTIVATED_BY_KUEUE,
            "RequeuingLimitExceeded",
            id="kueue-deactivation-target-in-progress",
        ),
        # someone else: reason exactly Deactivated, no hold annotation
        pytest.param(
            tj(ann=OPENED),
            wl(active=False, conds=[cond("Evicted", reason="Deactivated")]),
            State.DEACTIVATED_BY_OTHER,
            None,
            id="other-deactivated-reason-deactivated",
        ),
        # someone else, before Kueue reacted (no condition yet)
        pytest.param(
            tj(ann=OPENED),
            wl(active=False),
            State.DEACTIVATED_BY_OTHER,
            None,
            id="other-deactivated-before-kueue-reacted",
        ),
        # a garbled annotation with active=true is not a hold in force
        pytest.param(
            tj(suspend=False, ann=OPENED),
            wl(ann=held_ann("2")),
            State.RUNNING,
            None,
            id="hold-annotation-on-active-workload-is-running",
        ),
        # start gate, running, waiting for admission
        pytest.param(tj(), wl(), State.AT_START_GATE, None, id="start-gate-with-workload"),
        pytest.param(tj(), None, State.AT_START_GATE, None, id="start-gate-without-workload"),
        pytest.param(
            tj(suspend=False, ann=OPENED),
            wl(active=None),
            State.RUNNING,
            None,
            id="running-workload-without-active-field",
        ),
        pytest.param(
            tj(ann=OPENED),
            wl(),
            State.WAITING_FOR_ADMISSION,
            None,
            id="waiting-for-admission-with-workload",
        ),
        pytest.param(
            tj(ann=OPENED),
            None,
            State.WAITING_FOR_ADMISSION,
            None,
            id="waiting-for-admission-without-workload",
        ),
        # ended wins
        pytest.param(
            tj(ann=OPENED, conds=[cond("Failed")]),
            wl(active=False, ann=held_ann("2")),
            State.ENDED,
            None,
            id="ended-wins-over-hold",
        ),
        # a False Evicted condition is no cause
        pytest.param(
            tj(ann=OPENED),
            wl(conds=[cond("Evicted", "False", "DeactivatedDueToAdmissionCheck")]),
            State.WAITING_FOR_ADMISSION,
            None,
            id="false-evicted-is-no-cause",
        ),
    ],
)
def test_classify_kueue(
    trainjob: dict[str, Any], workload: dict[str, Any] | None, state: State, cause: str | None
) -> None:
    o = classify(trainjob, workload, mode="kueue", annotations=A, ref=REF)
    assert o.state is state
    assert o.kueue_cause == cause


def test_classify_held_fields_and_attempt() -> None:
    o = classify(
        tj(ann={**OPENED, A.attempt: "3"}),
        wl(active=False, ann=held_ann("9")),
        mode="kueue",
        annotations=A,
        ref=REF,
    )
    assert (o.state, o.hold_instance, o.hold_reason, o.held_by, o.held_at) == (
        State.HELD,
        9,
        "r",
        HOLDER,
        "2026-01-01T00:00:00Z",
    )
    assert o.attempt == 3 and o.opened and o.workload == "wl"


@pytest.mark.parametrize(
    ("trainjob", "state"),
    [
        pytest.param(tj(ann=held_ann("2")), State.HELD, id="held"),
        pytest.param(tj(ann={**held_ann("2"), **OPENED}), State.HELD, id="held-after-opened"),
        pytest.param(tj(), State.AT_START_GATE, id="at-start-gate"),
        pytest.param(tj(suspend=False, ann=OPENED), State.RUNNING, id="running"),
        pytest.param(
            tj(ann=OPENED),
            State.DEACTIVATED_BY_OTHER,
            id="suspended-after-opened-is-deactivated-by-other",
        ),
        pytest.param(tj(ann=OPENED, conds=[cond("Complete")]), State.ENDED, id="ended"),
        # an annotation on an unsuspended TrainJob is not a hold in force
        pytest.param(
            tj(suspend=False, ann={**held_ann("2"), **OPENED}),
            State.RUNNING,
            id="hold-annotation-on-unsuspended-is-running",
        ),
    ],
)
def test_classify_plain(trainjob: dict[str, Any], state: State) -> None:
    assert classify(trainjob, None, mode="plain", annotations=A, ref=REF).state is state


def test_kueue_cause_ignores_bare_prefix() -> None:
    assert kueue_cause(wl(conds=[cond("Evicted", reason="DeactivatedDueTo")])) is None


# ---- small helpers -------------------------------------------------------------------


def test_format_time_is_utc_rfc3339() -> None:
    t = datetime(2026, 1, 1, 14, 30, 5, 999, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(t) == "2026-01-01T12:30:05Z"
    with pytest.raises(ValueError):
        format_time(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param(None, 0, id="absent"),
        pytest.param("0", 0, id="zero"),
        pytest.param("12", 12, id="twelve"),
        pytest.param("012", None, id="leading-zero"),
        pytest.param("-1", None, id="negative"),
        pytest.param("", None, id="empty"),
        pytest.param("1.0", None, id="decimal-point"),
    ],
)
def test_parse_attempt(text: str | None, value: int | None) -> None:
    assert parse_attempt(text) == value


# ---- Start body validation -----------------------------------------------------------


def start_body(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "job", "namespace": "ns", **meta},
        "spec": {"runtimeRef": {"name": "torch"}},
    }


def test_start_body_plain_fills_suspend_and_coordinates() -> None:
    body = validate_start_body(start_body(), mode="plain", annotations=A)
    assert body["spec"]["suspend"] is True
    assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert body["kind"] == "TrainJob"


def test_start_body_kueue_leaves_suspend_alone() -> None:
    body = validate_start_body(
        start_body(labels={QUEUE_NAME_LABEL: "q"}), mode="kueue", annotations=A
    )
    assert "suspend" not in body["spec"]


@pytest.mark.parametrize(
    ("mode", "mutate", "field"),
    [
        pytest.param(
            "plain",
            lambda b: b["metadata"].pop("namespace"),
            "metadata.namespace",
            id="plain-missing-namespace",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(name="Bad_Name"),
            "metadata.name",
            id="plain-name-with-underscore",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(name="1abc"),
            "metadata.name",
            id="plain-name-starting-with-digit",
        ),
        pytest.param("plain", lambda b: b.update(kind="Job"), "kind", id="plain-wrong-kind"),
        pytest.param(
            "plain", lambda b: b.update(apiVersion="v1"), "apiVersion", id="plain-wrong-api-version"
        ),
        pytest.param(
            "plain",
            lambda b: b.update(spec={}),
            "spec.runtimeRef.name",
            id="plain-missing-runtime-ref",
        ),
        pytest.param(
            "plain",
            lambda b: b["spec"].update(suspend=False),
            "spec.suspend",
            id="plain-suspend-false",
        ),
        pytest.param(
            "plain",
            lambda b: b["spec"].update(suspend="yes"),
            "spec.suspend",
            id="plain-suspend-not-a-bool",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(resourceVersion="1"),
            "metadata.resourceVersion",
            id="plain-resource-version-set",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(annotations={A.hold_instance: "1"}),
            A.hold_instance,
            id="plain-hold-annotation-set",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(annotations={A.attempt: "1"}),
            A.attempt,
            id="plain-attempt-annotation-set",
        ),
        pytest.param(
            "plain",
            lambda b: b["metadata"].update(labels={QUEUE_NAME_LABEL: "q"}),
            QUEUE_NAME_LABEL,
            id="plain-queue-label-set",
        ),
        pytest.param("kueue", lambda b: None, QUEUE_NAME_LABEL, id="kueue-missing-queue-label"),
    ],
)
def test_start_body_invalid_names_the_field(mode: str, mutate: Any, field: str) -> None:
    body = start_body()
    mutate(body)
    with pytest.raises(ValueError, match=field.replace(".", r"\.").replace("[", r"\[")):
        validate_start_body(body, mode=mode, annotations=A)  # type: ignore[arg-type]


def test_start_body_not_a_mapping() -> None:
    with pytest.raises(ValueError, match="mapping"):
        validate_start_body([], mode="plain", annotations=A)


# ---- properties ----------------------------------------------------------------------

modes = st.sampled_from(["kueue", "plain"])
instance_texts = st.one_of(
    st.none(),
    st.integers(min_value=1, max_value=50).map(str),
    st.sampled_from(["0", "01", "x", "", "-3", " 2"]),
)
conditions = st.lists(
    st.builds(
        cond,
        st.sampled_from(["Complete", "Failed", "Evicted", "DeactivationTarget", "Admitted"]),
        st.sampled_from(["True", "False"]),
        st.sampled_from(
            ["Deactivated", "DeactivatedDueToRequeuingLimitExceeded", "R", "DeactivatedDueTo"]
        ),
    ),
    max_size=3,
)


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    ann: dict[str, str] = {}
    raw = draw(instance_texts)
    if raw is not None:
        ann.update(held_ann(raw))
    if draw(st.booleans()):
        ann[A.opened] = "2026-01-01T00:00:00Z"
    if draw(st.booleans()):
        ann[A.attempt] = str(draw(st.integers(min_value=0, max_value=9)))
    spec: dict[str, Any] = {}
    for key in ("suspend", "active"):
        value = draw(st.sampled_from([True, False, None]))
        if value is not None:
            spec[key] = value
    return obj(spec=spec, ann=ann, conditions=draw(conditions))


def _instance_of(o: dict[str, Any]) -> str | None:
    return (o["metadata"].get("annotations") or {}).get(A.hold_instance)


@settings(max_examples=400)
@given(
    objects(),
    modes,
    st.integers(min_value=1, max_value=50),
    st.booleans(),
    instance_texts,
)
def test_property_hold(
    o: dict[str, Any], mode: str, m: int, after_conflict: bool, last_seen: str | None
) -> None:
    before = copy.deepcopy(o)
    d = hold(o, mode, m, after_conflict=after_conflict, last_seen_instance=last_seen)
    assert o == before, "decisions never mutate what was read"
    current = _instance_of(o)
    if d.outcome is Outcome.WRITE:
        assert d.body is not None
        written = d.body["metadata"]["annotations"]
        assert written[A.hold_instance] == str(m)
        assert set(A.hold_keys) <= set(written)
        assert written[A.held_by] == HOLDER
        assert d.body["metadata"]["resourceVersion"] == "42"
        if mode == "kueue":
            assert d.body["spec"]["active"] is False
            assert d.body["spec"].get("suspend") == o["spec"].get("suspend")
        else:
            assert d.body["spec"]["suspend"] is True
        # never replaces a newer valid instance
        if current is not None and current.isdigit() and current[0] != "0":
            assert int(current) <= m
        if after_conflict:
            assert current == last_seen or current == str(m)
    elif d.outcome is Outcome.DONE:
        assert current == str(m)
    else:
        assert d.outcome is Outcome.STALE


@settings(max_examples=400)
@given(objects(), modes, st.integers(min_value=1, max_value=50), st.booleans())
def test_property_release(o: dict[str, Any], mode: str, m: int, pods: bool) -> None:
    d = release(o, mode, m, pods)
    current = _instance_of(o)
    if current != str(m):
        assert d.outcome is Outcome.STALE, "a release never touches another instance"
        return
    if d.outcome is not Outcome.WRITE:
        assert d.outcome in (Outcome.PODS_REMAIN, Outcome.REJECTED)
        return
    assert d.body is not None
    assert not set(A.hold_keys) & set(d.body["metadata"]["annotations"])
    if mode == "kueue":
        assert d.body["spec"]["active"] is True
        assert d.body["spec"].get("suspend") == o["spec"].get("suspend")
        assert d.body["metadata"]["annotations"].get(A.attempt) == (
            o["metadata"]["annotations"].get(A.attempt)
        )
    elif d.body["spec"].get("suspend") is False and o["spec"].get("suspend") is not False:
        ann = o["metadata"]["annotations"]
        assert A.opened in ann
        assert not any(
            c["type"] in ("Complete", "Failed") and c["status"] == "True"
            for c in o.get("status", {}).get("conditions", [])
        )
        assert not pods
        assert int(d.body["metadata"]["annotations"][A.attempt]) == int(ann.get(A.attempt, 0)) + 1


@settings(max_examples=400)
@given(objects(), modes)
def test_property_open(o: dict[str, Any], mode: str) -> None:
    d = decide_open(o, mode=mode, now=NOW, annotations=A)  # type: ignore[arg-type]
    if d.body is None:
        return
    before = o["metadata"].get("annotations") or {}
    after = d.body["metadata"]["annotations"]
    for key in A.hold_keys:
        assert after.get(key) == before.get(key), "Open never lifts or changes a hold"
    if mode == "kueue" or _instance_of(o) is not None:
        assert d.body["spec"].get("suspend") == o["spec"].get("suspend")


@settings(max_examples=400)
@given(objects(), st.one_of(st.none(), objects()))
def test_property_classify_never_calls_an_unannotated_deactivation_a_hold(
    trainjob: dict[str, Any], workload: dict[str, Any] | None
) -> None:
    o = classify(trainjob, workload, mode="kueue", annotations=A, ref=REF)
    if o.state is State.HELD:
        assert workload is not None and _instance_of(workload) is not None
        assert workload["spec"].get("active", True) is False
    p = classify(trainjob, None, mode="plain", annotations=A, ref=REF)
    if p.state is State.HELD:
        assert _instance_of(trainjob) is not None and trainjob["spec"].get("suspend") is True


# -- leftover pods and the gate's AdmissionChecks (pure) --------------------------------

RUNNING_POD = {"name": "b-run", "deleting": False, "phase": "Running"}
DYING_POD = {"name": "a-dying", "deleting": True, "phase": "Running"}
DONE_POD = {"name": "c-done", "deleting": False, "phase": "Succeeded"}
ALL_PODS = [RUNNING_POD, DYING_POD, DONE_POD]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(State.HELD, ("a-dying", "b-run", "c-done"), id="held-all"),
        pytest.param(State.DEACTIVATED_BY_KUEUE, ("a-dying", "b-run", "c-done"), id="kueue-all"),
        pytest.param(State.DEACTIVATED_BY_OTHER, ("a-dying", "b-run", "c-done"), id="other-all"),
        pytest.param(State.AT_START_GATE, ("a-dying", "b-run", "c-done"), id="gate-all"),
        pytest.param(State.WAITING_FOR_ADMISSION, ("a-dying", "b-run", "c-done"), id="wait-all"),
        pytest.param(State.RUNNING, ("a-dying",), id="running-only-deleting"),
        pytest.param(State.ENDED, ("a-dying", "b-run"), id="ended-only-unfinished"),
    ],
)
def test_leftover_pods_by_state(state: State, expected: tuple[str, ...]) -> None:
    assert leftover_pods(state, ALL_PODS) == expected


_pod_views = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.text("abc", min_size=1, max_size=4),
            "deleting": st.booleans(),
            "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed", None]),
        }
    ),
    max_size=6,
)


@given(state=st.sampled_from(list(State)), pods=_pod_views)
@settings(max_examples=300, deadline=None)
def test_leftover_pods_properties(state: State, pods: list[dict[str, Any]]) -> None:
    left = leftover_pods(state, pods)
    assert list(left) == sorted(left)  # deterministic
    assert set(left) <= {p["name"] for p in pods}
    assert leftover_pods(state, list(reversed(pods))) == left  # order of the LIST is no fact
    # A pod being deleted is never part of a current execution (an ended job's finished
    # pods aside: those are its record, not an execution).
    finished = ("Succeeded", "Failed")
    for pod in pods:
        if pod["deleting"] and not (state is State.ENDED and pod["phase"] in finished):
            assert pod["name"] in left
    if state is State.RUNNING:
        deleting = {p["name"] for p in pods if p["deleting"]}
        assert set(left) == deleting


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, [], id="none"),
        pytest.param({"admissionChecks": ["a", "b"]}, ["a", "b"], id="v1beta1-list"),
        pytest.param(
            {"admissionChecksStrategy": {"admissionChecks": [{"name": "g"}, {"name": "a"}]}},
            ["a", "g"],
            id="v1beta2-strategy",
        ),
        pytest.param(
            {
                "admissionChecks": ["a"],
                "admissionChecksStrategy": {"admissionChecks": [{"name": "a"}, {}, "junk"]},
            },
            ["a"],
            id="both-deduplicated-and-junk-ignored",
        ),
    ],
)
def test_cluster_queue_admission_checks(spec: dict[str, Any], expected: list[str]) -> None:
    assert cluster_queue_admission_checks({"spec": spec}) == expected


# ---- plain-mode Release: when a pod check carries over to a retry's read ------------------


def suspended_at(generation: Any, *, uid: Any = "u1", suspend: Any = True) -> dict[str, Any]:
    body = obj(ann=held_ann("1"), spec={"suspend": suspend})
    body["metadata"].update(uid=uid, generation=generation)
    return body


def _with_meta(body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], **fields}}


@pytest.mark.parametrize(
    ("checked_after", "now", "carries"),
    [
        (suspended_at(3), suspended_at(3), True),  # only status (or metadata) was written
        (suspended_at(3), _with_meta(suspended_at(3), resourceVersion="99"), True),
        (suspended_at(3), suspended_at(4), False),  # the spec changed: it may have run
        (suspended_at(3), suspended_at(5), False),  # unsuspended and suspended again
        (suspended_at(3), suspended_at(3, uid="u2"), False),  # another object of that name
        (suspended_at(3), suspended_at(3, suspend=False), False),
        (suspended_at(3, suspend=False), suspended_at(3), False),
        (suspended_at(3), suspended_at(3, suspend="true"), False),  # only literally true
        (suspended_at(None), suspended_at(None), False),  # nothing to compare
        (suspended_at(3), suspended_at(None), False),
        (suspended_at("3"), suspended_at("3"), False),  # a generation is an integer
        (suspended_at(True), suspended_at(True), False),
        (suspended_at(3, uid=""), suspended_at(3, uid=""), False),
        (suspended_at(3, uid=None), suspended_at(3, uid=None), False),
        (
            suspended_at(3),
            _with_meta(suspended_at(3), deletionTimestamp="2026-01-01T00:00:00Z"),
            False,
        ),
        ({}, suspended_at(3), False),
        (suspended_at(3), {"metadata": None}, False),
    ],
)
def test_pod_check_carries_over_table(
    checked_after: dict[str, Any], now: dict[str, Any], carries: bool
) -> None:
    assert pod_check_carries_over(checked_after, now) is carries


_generations = st.one_of(st.integers(min_value=0, max_value=2**63 - 1), st.none(), st.text())


@given(
    gen_a=_generations,
    gen_b=_generations,
    uid_a=st.sampled_from(["u1", "u2", "", None]),
    uid_b=st.sampled_from(["u1", "u2", "", None]),
    suspend_a=st.sampled_from([True, False, None, "true"]),
    suspend_b=st.sampled_from([True, False, None, "true"]),
)
def test_property_a_pod_check_carries_over_only_across_a_suspended_unchanged_spec(
    gen_a: Any, gen_b: Any, uid_a: Any, uid_b: Any, suspend_a: Any, suspend_b: Any
) -> None:
    a = suspended_at(gen_a, uid=uid_a, suspend=suspend_a)
    b = suspended_at(gen_b, uid=uid_b, suspend=suspend_b)
    carries = pod_check_carries_over(a, b)
    proven = (
        type(gen_a) is int
        and gen_a == gen_b
        and type(gen_b) is int
        and isinstance(uid_a, str)
        and uid_a != ""
        and uid_a == uid_b
        and suspend_a is True
        and suspend_b is True
    )
    assert carries is proven
    # Neither read is modified by asking.
    assert a == suspended_at(gen_a, uid=uid_a, suspend=suspend_a)


# ---- Start where Kueue manages jobs without a queue name -------------------------------


@pytest.mark.parametrize(
    ("manage", "body", "namespace"),
    [
        (False, start_body(), ""),  # the setting off: no namespace to read
        (True, start_body(), "ns"),  # on, no label: the namespace's labels decide
        (True, start_body(labels={QUEUE_NAME_LABEL: "q"}), ""),  # labelled: Kueue's anyway
        (True, {"metadata": {"name": "job", "namespace": "NS!"}}, ""),  # malformed: validation
        (True, [], ""),
    ],
)
def test_start_reads_the_namespace_only_when_it_decides(
    manage: bool, body: Any, namespace: str
) -> None:
    assert needs_namespace_for_start(body, manage_jobs_without_queue_name=manage) == namespace


def test_start_in_kueue_mode_takes_a_queueless_trainjob_where_kueue_manages_it() -> None:
    body = validate_start_body(
        start_body(), mode="kueue", annotations=A, kueue_manages_unlabelled=True
    )
    assert "suspend" not in body["spec"]  # Kueue owns it
    with pytest.raises(
        ValueError, match=r"queue-name\]: required in Kueue mode .*manageJobsWithoutQueueName"
    ):
        validate_start_body(start_body(), mode="kueue", annotations=A)


def test_start_in_plain_mode_refuses_a_namespace_kueue_manages() -> None:
    with pytest.raises(
        ValueError, match=r"metadata.namespace: Kueue manages every TrainJob in namespace ns"
    ):
        validate_start_body(
            start_body(), mode="plain", annotations=A, kueue_manages_unlabelled=True
        )
    body = validate_start_body(
        start_body(), mode="plain", annotations=A, kueue_manages_unlabelled=False
    )
    assert body["spec"]["suspend"] is True
