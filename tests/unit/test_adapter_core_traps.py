"""The traps (issue 29) in the sans-I/O core, driven by a script: what Release returns and
raises, what Observe reports, which requests go out and which do not.

Against the real controllers: tests/real/test_kueue_traps.py and test_trainer_traps.py.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from holdwarden.adapter.errors import RuntimeMissing, StaleHold
from holdwarden.adapter.steps import ApiStatusError, Send
from holdwarden.adapter.types import CallMeta, ReleaseResult, State
from tests.unit.test_adapter_core import (
    NOW,
    REF,
    Answer,
    Clock,
    drive,
    held_opened,
    kueue_core,
    plain_core,
    sends,
    trainjob,
    workload,
)

MET = "DeactivatedDueToMaximumExecutionTimeExceeded"
HOLD = {
    "holdwarden.io/hold-instance": "1",
    "holdwarden.io/hold-reason": "r",
    "holdwarden.io/held-at": "2026-12-03T11:00:00Z",
    "holdwarden.io/held-by": "dispatch",
}
RUNTIME_PATH = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/torch"
REFUSAL = (
    'admission webhook "validate.trainjob.trainer.kubeflow.org" denied the request: '
    'spec.RuntimeRef: Invalid value: {"name":"torch"}: clustertrainingruntimes.trainer.'
    'kubeflow.org "torch" not found: specified clusterTrainingRuntime must be created '
    "before the TrainJob is created"
)


def not_found() -> ApiStatusError:
    return ApiStatusError(404, "Not Found", json.dumps({"message": "not found"}))


def held_workload(*conditions: dict[str, str]) -> dict[str, Any]:
    wl = workload("7")
    wl["metadata"]["annotations"] = dict(HOLD)
    wl["spec"] = {"active": False}
    wl["status"] = {"conditions": list(conditions)}
    return wl


def kueue_answers(wl: dict[str, Any], runtime: Answer) -> Any:
    def answer(send: Send) -> Answer:
        path = send.http.path
        if send.http.method == "PATCH":
            return None
        if path.endswith("/trainjobs/llm"):
            return trainjob()
        if path.endswith("/workloads/wl"):
            return wl
        if path == RUNTIME_PATH:
            return runtime
        raise AssertionError(f"unexpected request {send.http.method} {path}")

    return answer


def stopped_by_kueue() -> dict[str, Any]:
    return held_workload(
        {"type": "Evicted", "status": "True", "reason": MET, "message": ""},
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ""},
        {"type": "Requeued", "status": "False", "reason": MET, "message": ""},
    )


def test_a_kueue_release_after_kueues_own_deactivation_returns_the_warning() -> None:
    core = kueue_core(Clock())
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        kueue_answers(stopped_by_kueue(), {"metadata": {"name": "torch"}}),
    )
    result = steps[-1]
    assert isinstance(result, ReleaseResult), result
    assert result.kueue_requeue_blocked == MET
    assert len(result.warnings) == 1 and "team-a/wl" in result.warnings[0]
    assert "delete the Workload" in result.warnings[0]
    # The hold was lifted all the same: the PATCH reactivates the Workload.
    (patch,) = sends(steps, "PATCH")
    assert patch.http.body is not None and patch.http.body["spec"] == {"active": True}


def test_a_kueue_release_of_a_plain_hold_returns_no_warning() -> None:
    core = kueue_core(Clock())
    hold_only = held_workload(
        {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": ""},
        {"type": "Requeued", "status": "False", "reason": "Deactivated", "message": ""},
    )
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        kueue_answers(hold_only, {"metadata": {"name": "torch"}}),
    )
    assert steps[-1] == ReleaseResult(REF, 1)


def test_a_kueue_release_whose_runtime_is_gone_writes_nothing_and_names_it() -> None:
    core = kueue_core(Clock())
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        kueue_answers(held_workload(), not_found()),
    )
    error = steps[-1]
    assert isinstance(error, RuntimeMissing), error
    assert error.runtime == "ClusterTrainingRuntime torch"
    assert "ClusterTrainingRuntime torch does not exist" in str(error)
    assert "Re-create" in str(error)
    assert not sends(steps, "PATCH")
    # One GET of the runtime, after the read and before any write.
    assert [s.http.path for s in sends(steps, "GET")][-1] == RUNTIME_PATH


def test_a_kueue_release_that_may_not_read_runtimes_goes_on() -> None:
    core = kueue_core(Clock())
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        kueue_answers(held_workload(), ApiStatusError(403, "Forbidden", "{}")),
    )
    assert isinstance(steps[-1], ReleaseResult), steps[-1]
    assert len(sends(steps, "PATCH")) == 1


def test_a_stale_kueue_release_does_not_look_up_the_runtime() -> None:
    core = kueue_core(Clock())
    wl = held_workload()
    wl["metadata"]["annotations"]["holdwarden.io/hold-instance"] = "2"
    steps = drive(
        core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)),
        kueue_answers(wl, not_found()),
    )
    assert isinstance(steps[-1], StaleHold), steps[-1]
    assert RUNTIME_PATH not in [s.http.path for s in sends(steps, "GET")]


def test_a_plain_release_refused_by_trainers_webhook_is_runtime_missing() -> None:
    core = plain_core(Clock())

    def answer(send: Send) -> Answer:
        if send.http.method == "PATCH":
            return ApiStatusError(422, "Unprocessable Entity", json.dumps({"message": REFUSAL}))
        if send.http.path.endswith("/pods"):
            return {"items": []}
        return held_opened("5")

    steps = drive(core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)), answer)
    error = steps[-1]
    assert isinstance(error, RuntimeMissing), error
    assert error.runtime == "ClusterTrainingRuntime torch"
    # The API server's own words are kept, not swallowed.
    assert str(error).endswith(REFUSAL)
    assert len(sends(steps, "PATCH")) == 1  # not retried: the refusal is not a conflict


def test_a_plain_release_refused_otherwise_keeps_its_old_class() -> None:
    core = plain_core(Clock())

    def answer(send: Send) -> Answer:
        if send.http.method == "PATCH":
            return ApiStatusError(422, "Invalid", json.dumps({"message": "spec.x: Invalid"}))
        if send.http.path.endswith("/pods"):
            return {"items": []}
        return held_opened("5")

    error = drive(core.release(REF, CallMeta(NOW + timedelta(seconds=10), 1)), answer)[-1]
    assert type(error).__name__ == "Invalid", error


def test_observe_reports_a_stranded_workload() -> None:
    core = kueue_core(Clock())
    wl = stopped_by_kueue()
    wl["metadata"]["annotations"] = {}
    wl["spec"] = {"active": True}  # released: active, and never queued by Kueue <= v0.19
    suspended = trainjob()
    suspended["spec"]["suspend"] = True
    suspended["metadata"]["annotations"] = {"holdwarden.io/opened": "2026-12-03T10:00:00Z"}

    def answer(send: Send) -> Answer:
        if send.http.path.endswith("/trainjobs/llm"):
            return suspended
        if send.http.path.endswith("/workloads/wl"):
            return wl
        return {"items": []}

    observed = drive(core.observe(REF), answer)[-1]
    assert observed.state is State.DEACTIVATED_BY_KUEUE
    assert observed.kueue_requeue_blocked == MET
    assert observed.stranded and observed.to_dict()["stranded"] is True
