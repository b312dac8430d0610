"""Kueue's own deactivation, on the real Kueue: a TrainJob whose time limit
(``kueue.x-k8s.io/max-exec-time-seconds``) runs out is deactivated by Kueue, and Observe
classifies it as Kueue's, with its cause, not as a hold."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.types import State
from holdwarden.config import Config
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_queues,
    with_requests,
)
from tests.real.story import meta

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"


def test_a_time_limit_deactivation_is_kueues_with_its_cause(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, real_namespace: str
) -> None:
    make_queues(real_admin, real_namespace)
    objects = Objects(real_admin, real_namespace)
    body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
    body["metadata"]["namespace"] = real_namespace
    body["metadata"]["labels"][MAX_EXEC_TIME_LABEL] = "5"
    with real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter = Adapter(Config(mode="kueue"), supervisor)
        ref = adapter.start(body, meta())
        adapter.open(ref, meta())
        eventually(lambda: not objects.suspended(), "Kueue admits and runs the job")
        workload = eventually(
            lambda: (
                (w := objects.workload()) is not None and w["spec"].get("active") is False and w
            ),
            "Kueue deactivates the Workload when its time runs out",
        )
        evicted = eventually(lambda: condition(objects.workload(), "Evicted"), "Kueue evicts")
        observed = adapter.observe(ref)
    assert workload["spec"].get("maximumExecutionTimeSeconds") == 5
    assert observed.state is State.DEACTIVATED_BY_KUEUE, (observed, evicted)
    assert observed.kueue_cause == "MaximumExecutionTimeExceeded", evicted
    assert observed.hold_instance is None
