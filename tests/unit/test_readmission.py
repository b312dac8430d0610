"""The readmission gate's pure decision: table tests and properties."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden import objects
from holdwarden.readmission.decisions import (
    GateAction,
    decide_readmission,
    granted_attempt,
    why_waiting,
)
from holdwarden.vocabulary import Annotations

NOTES = Annotations()
CHECKS = frozenset({"holdwarden-readmission"})
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def workload(
    *, state: str = "Pending", message: str = "", hold: str | None = None, active: bool = True
) -> dict[str, Any]:
    annotations = {NOTES.hold_instance: hold} if hold is not None else {}
    return {
        "metadata": {"name": "wl", "namespace": "ns", "annotations": annotations},
        "spec": {"active": active},
        "status": {
            "admissionChecks": [
                {
                    "name": "other-check",
                    "state": "Pending",
                    "message": "",
                    "lastTransitionTime": "x",
                },
                {
                    "name": "holdwarden-readmission",
                    "state": state,
                    "message": message,
                    "lastTransitionTime": "x",
                },
            ]
        },
    }


def trainjob(
    *, opened: bool = True, attempt: str | None = None, ended: str | None = None
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if opened:
        annotations[NOTES.opened] = "2026-12-02T11:00:00Z"
    if attempt is not None:
        annotations[NOTES.attempt] = attempt
    conditions = [{"type": ended, "status": "True"}] if ended else []
    return {
        "metadata": {"name": "job", "annotations": annotations},
        "status": {"conditions": conditions},
    }


def decide(wl: dict[str, Any], tj: dict[str, Any] | None, pods: int = 0) -> Any:
    return decide_readmission(wl, tj, pods, check_names=CHECKS, annotations=NOTES, now=NOW)


@pytest.mark.parametrize(
    ("wl", "tj", "pods", "why"),
    [
        pytest.param(workload(), None, 0, "its TrainJob was not found", id="trainjob-not-found"),
        pytest.param(workload(), trainjob(opened=False), 0, "has not been opened", id="not-opened"),
        pytest.param(
            workload(), trainjob(ended="Complete"), 0, "has ended (Complete)", id="ended-complete"
        ),
        pytest.param(
            workload(), trainjob(ended="Failed"), 0, "has ended (Failed)", id="ended-failed"
        ),
        pytest.param(
            workload(hold="3"), trainjob(), 0, "hold instance 3 is in force", id="hold-in-force"
        ),
        pytest.param(
            workload(hold="garbled"),
            trainjob(),
            0,
            "hold instance garbled is in force",
            id="garbled-hold-in-force",
        ),
        pytest.param(workload(active=False), trainjob(), 0, "deactivated", id="deactivated"),
        pytest.param(
            workload(), trainjob(), 2, "2 pod(s) of the previous execution remain", id="pods-remain"
        ),
    ],
)
def test_pending_check_waits_and_says_why(
    wl: dict[str, Any], tj: dict[str, Any] | None, pods: int, why: str
) -> None:
    decision = decide(wl, tj, pods)
    assert decision.action is GateAction.KEEP_PENDING
    assert why in decision.reason
    entry = decision.workload["status"]["admissionChecks"][1]
    assert entry["state"] == "Pending"
    assert why in entry["message"]
    # Asked again with the message already written, the gate writes nothing.
    again = decide(decision.workload, tj, pods)
    assert again.action is GateAction.NOTHING


RESET = "Reset to Pending after eviction. Previously: Ready"  # Kueue's message


def granted_on(wl: dict[str, Any], attempt: int) -> dict[str, Any]:
    """``wl`` with the gate's grant condition for ``attempt``, as MARK_READY writes it."""
    wl = copy.deepcopy(wl)
    wl["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ""},
        objects.granted_condition(NOTES, attempt, "2026-12-02T11:59:00Z"),
    ]
    return wl


def test_a_grant_records_its_attempt_in_a_condition_in_the_same_write() -> None:
    decision = decide(workload(), trainjob(attempt="2"))
    assert decision.action is GateAction.MARK_READY
    assert objects.recorded_grant(decision.workload, NOTES) == 3
    (condition,) = decision.workload["status"]["conditions"]
    assert condition["type"] == "holdwarden.io/AttemptGranted"
    assert condition["status"] == "True" and condition["reason"] == "Granted"
    # A later grant replaces the record; other conditions stay.
    again = decide(granted_on(workload(message=RESET), 3), trainjob(attempt="3"))
    assert again.action is GateAction.MARK_READY
    assert objects.recorded_grant(again.workload, NOTES) == 4
    assert [c["type"] for c in again.workload["status"]["conditions"]] == [
        "QuotaReserved",
        "holdwarden.io/AttemptGranted",
    ]


@pytest.mark.parametrize(
    ("state", "message", "hold", "then"),
    [
        pytest.param("Pending", RESET, None, GateAction.MARK_READY, id="released-after-reset"),
        pytest.param("Pending", RESET, "7", GateAction.KEEP_PENDING, id="still-held"),
        pytest.param(
            "Ready", "holdwarden: attempt 5 admitted", None, GateAction.NOTHING, id="ready"
        ),
    ],
)
def test_a_grant_not_yet_on_the_trainjob_is_recorded_before_anything_else(
    state: str, message: str, hold: str | None, then: GateAction
) -> None:
    # The gate granted attempt 5 and stopped before it raised A; then a hold made Kueue
    # reset the check (its message replaced). The next gate raises A to 5 first, held or
    # not, and its next grant is 6, never 5 again.
    wl = granted_on(workload(state=state, message=message, hold=hold, active=hold is None), 5)
    decision = decide(wl, trainjob(attempt="4"))
    assert decision.action is GateAction.RAISE_ATTEMPT
    assert decision.trainjob["metadata"]["annotations"][NOTES.attempt] == "5"
    after = decide(wl, decision.trainjob)
    assert after.action is then
    if then is GateAction.MARK_READY:
        assert granted_attempt(after.workload["status"]["admissionChecks"][1]["message"]) == 6


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(None, id="absent"),
        pytest.param("attempt x admitted by the readmission gate", id="garbled"),
        pytest.param("attempt 99999999999999999999 admitted by the readmission gate", id="huge"),
        pytest.param(" attempt 3 admitted by the readmission gate", id="padded"),
    ],
)
def test_no_readable_record_means_no_recorded_grant(record: str | None) -> None:
    wl = workload(message=RESET)
    if record is not None:
        wl["status"]["conditions"] = [
            {"type": NOTES.attempt_granted, "status": "True", "reason": "Granted",
             "message": record, "lastTransitionTime": "x"}
        ]  # fmt: skip
    assert objects.recorded_grant(wl, NOTES) is None
    decision = decide(wl, trainjob(attempt="2"))
    assert decision.action is GateAction.MARK_READY  # granted from A, as before
    assert granted_attempt(decision.workload["status"]["admissionChecks"][1]["message"]) == 3


@given(st.integers(0, 50), st.integers(1, 50))
def test_the_recorded_grant_never_lowers_a_and_a_grant_follows_every_record(
    attempt: int, recorded: int
) -> None:
    wl = granted_on(workload(message=RESET), recorded)
    decision = decide(wl, trainjob(attempt=str(attempt)))
    if attempt < recorded:
        assert decision.action is GateAction.RAISE_ATTEMPT
        assert decision.trainjob["metadata"]["annotations"][NOTES.attempt] == str(recorded)
    else:
        assert decision.action is GateAction.MARK_READY
        granted = granted_attempt(decision.workload["status"]["admissionChecks"][1]["message"])
        assert granted == attempt + 1


@pytest.mark.parametrize(
    ("attempt", "granted"),
    [
        pytest.param(None, 1, id="absent"),
        pytest.param("0", 1, id="zero"),
        pytest.param("4", 5, id="four"),
    ],
)
def test_pending_check_turns_ready_with_the_next_attempt(attempt: str | None, granted: int) -> None:
    decision = decide(workload(), trainjob(attempt=attempt))
    assert decision.action is GateAction.MARK_READY
    entry = decision.workload["status"]["admissionChecks"][1]
    assert entry["state"] == "Ready"
    assert granted_attempt(entry["message"]) == granted
    assert entry["lastTransitionTime"] == "2026-12-02T12:00:00Z"
    # The other check is never touched.
    assert (
        decision.workload["status"]["admissionChecks"][0]
        == workload()["status"]["admissionChecks"][0]
    )


@pytest.mark.parametrize("garbled", ["junk", "-1", "01", " 3", "1e3", "9" * 20])
def test_a_garbled_attempt_keeps_the_check_pending_as_the_adapter_refuses_to_run_it(
    garbled: str,
) -> None:
    """One meaning for P/attempt (holdwarden.objects): the adapter refuses to unsuspend a
    TrainJob whose count it cannot read, and the gate, which once read it as 0 and granted
    attempt 1, now waits with the same advice."""
    decision = decide(workload(), trainjob(attempt=garbled))
    assert decision.action is GateAction.KEEP_PENDING
    assert "is not a decimal integer; fix it by hand" in decision.reason
    entry = decision.workload["status"]["admissionChecks"][1]
    assert entry["state"] == "Pending"


def test_ready_check_raises_attempt_once() -> None:
    ready = workload(state="Ready", message="holdwarden: attempt 5 admitted")
    raise_it = decide(ready, trainjob(attempt="4"))
    assert raise_it.action is GateAction.RAISE_ATTEMPT
    assert raise_it.trainjob["metadata"]["annotations"][NOTES.attempt] == "5"
    # Once recorded, nothing more; and a higher A is never lowered.
    assert decide(ready, raise_it.trainjob).action is GateAction.NOTHING
    assert decide(ready, trainjob(attempt="9")).action is GateAction.NOTHING


@pytest.mark.parametrize(
    "wl",
    [
        pytest.param(workload(state="Retry"), id="retry"),
        pytest.param(workload(state="Rejected"), id="rejected"),
        pytest.param(
            workload(state="Ready", message="set by someone else"), id="ready-set-by-someone-else"
        ),
    ],
)
def test_states_that_are_not_ours_are_left_alone(wl: dict[str, Any]) -> None:
    assert decide(wl, trainjob()).action is GateAction.NOTHING


def test_workload_without_our_check_is_left_alone() -> None:
    wl = workload()
    wl["status"]["admissionChecks"].pop()
    assert decide(wl, trainjob()).action is GateAction.NOTHING


def test_inputs_are_not_mutated() -> None:
    wl, tj = workload(), trainjob(attempt="1")
    wl_before, tj_before = copy.deepcopy(wl), copy.deepcopy(tj)
    decide(wl, tj)
    decide(workload(state="Ready", message="holdwarden: attempt 2 admitted"), tj)
    assert (wl, tj) == (wl_before, tj_before)


@given(
    opened=st.booleans(),
    ended=st.sampled_from([None, "Complete", "Failed"]),
    hold=st.one_of(st.none(), st.sampled_from(["1", "7", "x"])),
    active=st.booleans(),
    pods=st.integers(0, 3),
    attempt=st.one_of(st.none(), st.integers(0, 50).map(str)),
)
def test_ready_only_when_nothing_stands_in_the_way(
    opened: bool, ended: str | None, hold: str | None, active: bool, pods: int, attempt: str | None
) -> None:
    wl = workload(hold=hold, active=active)
    tj = trainjob(opened=opened, ended=ended, attempt=attempt)
    decision = decide(wl, tj, pods)
    blocked = not opened or ended is not None or hold is not None or not active or pods > 0
    assert (decision.action is GateAction.MARK_READY) == (not blocked)
    assert (why_waiting(wl, tj, pods, NOTES) is None) == (not blocked)
    if decision.action is GateAction.MARK_READY:
        granted = granted_attempt(decision.workload["status"]["admissionChecks"][1]["message"])
        recorded = int(attempt) if attempt else 0
        assert granted == recorded + 1


def test_messages_name_the_workload_generation_they_were_decided_on() -> None:
    """Kueue's check entry has no observedGeneration field; the message carries it, and a
    new generation (a hold, a release) gets the message written afresh."""
    wl = workload()
    wl["metadata"]["generation"] = 7
    waiting = decide(wl, trainjob(), pods=1)
    assert waiting.action is GateAction.KEEP_PENDING
    message = waiting.workload["status"]["admissionChecks"][1]["message"]
    assert message.endswith(" remain (observedGeneration 7)")
    assert decide(waiting.workload, trainjob(), pods=1).action is GateAction.NOTHING
    newer = copy.deepcopy(waiting.workload)
    newer["metadata"]["generation"] = 8
    assert decide(newer, trainjob(), pods=1).action is GateAction.KEEP_PENDING
    ready = decide(newer, trainjob(attempt="2"))
    entry = ready.workload["status"]["admissionChecks"][1]
    assert entry["message"] == "holdwarden: attempt 3 admitted (observedGeneration 8)"
    assert granted_attempt(entry["message"]) == 3
    assert granted_attempt("holdwarden: attempt 3 admitted") == 3  # written before the suffix
    assert granted_attempt("holdwarden: attempt 3 admitted (observedGeneration x)") is None
