"""Issue 29, trap 1, on the real Kueue v0.19.2: a job Kueue deactivated itself (its time
limit, ``kueue.x-k8s.io/max-exec-time-seconds``), then held and released by the supervisor,
stays stopped for good. Release's result and Observe say so, and the remedy they name
(delete the Workload) runs the job again.

What Kueue v0.19.2 does here, seen: its DeactivationTarget condition outlives the
eviction, so it deactivates the released Workload again at once (``spec.active: false``,
no hold), and its Requeued condition stays False with its own reason, which by itself
keeps an active Workload out of the queue (kueue issue 14870, fixed in v0.20; that second
case, an active Workload never queued, is the requeuing limit's, read from Kueue's code and
pinned by the table tests in tests/unit/test_adapter_traps.py, not run here: it needs
waitForPodsReady's requeuing, which the rig does not configure).

"Never queued" cannot be shown by waiting: it is shown against a control. A second job in
the same queue, held and released by the supervisor alone, is released *after* the first
and is requeued and admitted; the first, released before it, still has no quota
reservation and its Requeued condition is still False with Kueue's reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.types import Ref, State
from holdwarden.config import Config
from holdwarden.vocabulary import WORKLOAD
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_queues,
    wait_local_queue_active,
    with_requests,
)
from tests.real.story import meta

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
MET = "DeactivatedDueToMaximumExecutionTimeExceeded"


def body(namespace: str, name: str, max_seconds: int | None) -> dict[str, Any]:
    job = with_requests(trainjob_body(name, queue=LOCAL_QUEUE, suspend=True))
    job["metadata"]["namespace"] = namespace
    if max_seconds is not None:
        job["metadata"]["labels"][MAX_EXEC_TIME_LABEL] = str(max_seconds)
    return job


def requeued_false_by_kueue(objects: Objects) -> dict[str, Any] | None:
    found = condition(objects.workload(), "Requeued")
    return found if found and found["status"] == "False" and found["reason"] == MET else None


def start_and_run(adapter: Adapter, objects: Objects, job: dict[str, Any]) -> Ref:
    ref = adapter.start(job, meta())
    adapter.open(ref, meta())
    eventually(lambda: not objects.suspended(), f"Kueue admits and runs {ref}")
    return ref


def test_a_job_kueue_deactivated_then_held_and_released_is_stranded_and_said_so(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, real_namespace: str
) -> None:
    make_queues(real_admin, real_namespace)
    wait_local_queue_active(real_admin, real_namespace)
    stopped = Objects(real_admin, real_namespace, "job")
    control = Objects(real_admin, real_namespace, "ctl")
    with real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter = Adapter(Config(mode="kueue"), supervisor)
        ref = start_and_run(adapter, stopped, body(real_namespace, "job", 5))
        # Kueue's time limit: it deactivates, evicts, suspends the job and clears the
        # reservation, leaving Requeued=False with its own reason.
        eventually(lambda: requeued_false_by_kueue(stopped), "Kueue stops the job itself")
        assert stopped.suspended()

        # The supervisor holds it (say a node was lost meanwhile) and releases it.
        adapter.hold(ref, meta(1), "node lost")
        released = adapter.release(ref, meta(1))
        assert released.kueue_requeue_blocked == MET, released
        (warning,) = released.warnings
        assert "delete the Workload" in warning and real_namespace in warning

        # The control: held and released by the supervisor alone, after the first.
        ctl = start_and_run(adapter, control, body(real_namespace, "ctl", None))
        adapter.hold(ctl, meta(1), "node lost")
        eventually(control.suspended, "Kueue evicts the held control job")
        assert adapter.release(ctl, meta(1)).warnings == ()
        eventually(lambda: not control.suspended(), "Kueue requeues and runs the control job")

        # The first, released earlier, is still out of the queue: no reservation, and the
        # Requeued condition Kueue v0.19.2 never turns back.
        workload = stopped.workload()
        assert workload is not None
        assert (condition(workload, "QuotaReserved") or {}).get("status") != "True", workload
        assert requeued_false_by_kueue(stopped), workload["status"]
        assert stopped.suspended()
        observed = adapter.observe(ref)
        assert observed.stranded, observed
        assert observed.kueue_requeue_blocked == MET
        # What Kueue v0.19.2 does after a time limit: the DeactivationTarget condition
        # outlives the eviction, and Kueue deactivated the released Workload again at once.
        assert observed.state is State.DEACTIVATED_BY_KUEUE and not observed.workload_active
        assert (condition(workload, "DeactivationTarget") or {}).get("status") == "True"

        # The remedy the warning names: delete the Workload; Kueue makes a new, active one
        # for the TrainJob and admits it (its time limit then stops it again: the label
        # is still on the TrainJob).
        old_uid = workload["metadata"]["uid"]
        k8s.CustomObjectsApi(real_admin).delete_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, real_namespace, WORKLOAD.plural,
            workload["metadata"]["name"],
        )  # fmt: skip

        def admitted_again() -> bool:
            fresh = stopped.workload()
            if fresh is None or fresh["metadata"]["uid"] == old_uid:
                return False
            reserved = condition(fresh, "QuotaReserved") or {}
            evicted = condition(fresh, "Evicted") or {}
            return reserved.get("status") == "True" or evicted.get("reason") == MET

        eventually(admitted_again, "Kueue admits the new Workload of the stranded job")
