"""Observe reports the Workload's AdmissionChecks, and a job admitted past every check
(``ungated_admission``): the readmission gate did not decide that execution. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from holdwarden import objects
from holdwarden.adapter.decisions import classify
from holdwarden.adapter.types import Ref, State
from holdwarden.vocabulary import Annotations

A = Annotations()
REF = Ref("ns", "job")


def _trainjob(suspend: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": "job", "annotations": {A.opened: "2026-12-02T12:00:00Z"}},
        "spec": {"suspend": suspend},
    }


def _workload(checks: Any) -> dict[str, Any]:
    status: dict[str, Any] = {} if checks is None else {"admissionChecks": checks}
    return {"metadata": {"name": "trainjob-job-1"}, "spec": {"active": True}, "status": status}


GATE = {"name": "holdwarden-readmission", "state": "Ready", "message": "attempt 2"}


@pytest.mark.parametrize(
    ("checks", "expected"),
    [
        pytest.param(None, (), id="no-status-field"),
        pytest.param([], (), id="empty-list"),
        pytest.param("garbage", (), id="not-a-list"),
        pytest.param([GATE], (("holdwarden-readmission", "Ready"),), id="the-gate"),
        pytest.param(
            [{"name": "z", "state": "Pending"}, GATE, {"state": "Ready"}, {"name": 3}, "x"],
            (("holdwarden-readmission", "Ready"), ("z", "Pending")),
            id="sorted-malformed-entries-dropped",
        ),
    ],
)
def test_admission_check_states(checks: Any, expected: tuple[tuple[str, str], ...]) -> None:
    assert objects.admission_check_states(_workload(checks)) == expected


@pytest.mark.parametrize(
    ("suspend", "checks", "state", "ungated"),
    [
        pytest.param(False, [], State.RUNNING, True, id="running-past-every-check"),
        pytest.param(False, None, State.RUNNING, True, id="running-no-status"),
        pytest.param(False, [GATE], State.RUNNING, False, id="running-through-the-gate"),
        pytest.param(True, [], State.WAITING_FOR_ADMISSION, False, id="waiting-is-not-ungated"),
    ],
)
def test_ungated_admission(suspend: bool, checks: Any, state: State, ungated: bool) -> None:
    observed = classify(_trainjob(suspend), _workload(checks), mode="kueue", annotations=A, ref=REF)
    assert observed.state is state
    assert observed.ungated_admission is ungated
    assert observed.to_dict()["ungatedAdmission"] is ungated
    assert observed.to_dict()["admissionChecks"] == dict(observed.admission_checks)


def test_plain_mode_has_no_workload_and_is_never_ungated() -> None:
    observed = classify(_trainjob(False), None, mode="plain", annotations=A, ref=REF)
    assert observed.state is State.RUNNING
    assert observed.admission_checks == () and observed.ungated_admission is False
