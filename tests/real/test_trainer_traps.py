"""Issue 29, trap 2, on the real Trainer v2.3.0 (its webhook) and Kueue v0.19.2: delete
the runtime of a held TrainJob and Trainer's webhook refuses every later update of it.
Kueue's TrainJob webhook reads it too, on every write of any TrainJob (seen here: it
answered the refusal as often as Trainer's). Preflight names the TrainJob and its runtime;
Release raises ``RuntimeMissing`` naming the runtime and writes nothing (plain mode: the
webhooks' refusal, classified, its words kept;
Kueue mode: found missing before the write, since there the write is the Workload's and
what would fail is Kueue's unsuspend and the gate's attempt raise). With the runtime made
again, the same Release succeeds. A Kueue-mode Hold of a running TrainJob whose runtime is
gone raises ``RuntimeMissing`` too, and writes nothing: Kueue could not suspend the
TrainJob on eviction (shown: with the Workload made inactive by hand, Kueue's suspend is
refused and the pods run on).

Both webhooks read runtimes through informer caches, so after each create or delete the
test waits for the caches, not for time: until a server-side dry-run write of the TrainJob
meets the expected answer.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.errors import RuntimeMissing
from holdwarden.adapter.types import Ref, State
from holdwarden.config import Config
from holdwarden.vocabulary import CLUSTERTRAININGRUNTIME, TRAININGRUNTIME, TRAINJOB, WORKLOAD
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import TRAINING_RUNTIME
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    eventually,
    make_queues,
    wait_local_queue_active,
    with_requests,
)
from tests.real.story import kueue_log, meta

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

MUST_EXIST = "must be created before the TrainJob is created"  # Trainer's refusal


def runtime_refusal(body: str, runtime: str) -> bool:
    """Trainer's or Kueue's webhook refused for the missing runtime. Both read it on
    every TrainJob write; which refusal the API server reports is not defined."""
    return MUST_EXIST in body or f"runtime '{runtime}' not found" in body


def make_runtime(admin: k8s.ApiClient, namespace: str, name: str) -> None:
    """A TrainingRuntime in ``namespace``: the upstream torch-distributed one's spec."""
    custom = k8s.CustomObjectsApi(admin)
    upstream: Any = custom.get_cluster_custom_object(
        CLUSTERTRAININGRUNTIME.group, CLUSTERTRAININGRUNTIME.version,
        CLUSTERTRAININGRUNTIME.plural, TRAINING_RUNTIME,
    )  # fmt: skip
    custom.create_namespaced_custom_object(
        TRAININGRUNTIME.group, TRAININGRUNTIME.version, namespace, TRAININGRUNTIME.plural,
        {
            "apiVersion": TRAININGRUNTIME.api_version,
            "kind": TRAININGRUNTIME.kind,
            "metadata": {"name": name, "labels": upstream["metadata"].get("labels") or {}},
            "spec": upstream["spec"],
        },
    )  # fmt: skip


def delete_runtime(admin: k8s.ApiClient, namespace: str, name: str) -> None:
    k8s.CustomObjectsApi(admin).delete_namespaced_custom_object(
        TRAININGRUNTIME.group, TRAININGRUNTIME.version, namespace, TRAININGRUNTIME.plural, name
    )


def update_refused_for_runtime(admin: k8s.ApiClient, ref: Ref, runtime: str) -> str | None:
    """A server-side dry-run update of the TrainJob: the webhooks' refusal for its runtime,
    or None when the update passes (nothing is stored either way)."""
    try:
        k8s.CustomObjectsApi(admin).patch_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, ref.namespace, TRAINJOB.plural, ref.name,
            {"metadata": {"annotations": {"test.holdwarden.io/probe": uuid.uuid4().hex}}},
            dry_run="All",
        )  # fmt: skip
    except k8s.ApiException as exc:
        if runtime_refusal(exc.body or "", runtime):
            return str(exc.body)
        raise
    return None


def created_refused_for_runtime(admin: k8s.ApiClient, body: dict[str, Any]) -> bool:
    """A server-side dry-run create of ``body``: True while a webhook's cache has not seen
    its runtime yet."""
    try:
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, body["metadata"]["namespace"], TRAINJOB.plural,
            body, dry_run="All",
        )  # fmt: skip
    except k8s.ApiException as exc:
        if runtime_refusal(exc.body or "", body["spec"]["runtimeRef"]["name"]):
            return True
        raise
    return False


def job(namespace: str, runtime: str, queue: str | None) -> dict[str, Any]:
    body = with_requests(trainjob_body("job", queue=queue, suspend=True))
    body["metadata"]["namespace"] = namespace
    body["spec"]["runtimeRef"] = {
        "name": runtime,
        "apiGroup": TRAININGRUNTIME.group,
        "kind": TRAININGRUNTIME.kind,
    }
    return body


@pytest.mark.parametrize("mode", ["plain", "kueue"])
def test_a_held_trainjob_whose_runtime_is_deleted_cannot_be_released_and_is_named(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, real_namespace: str, mode: str
) -> None:
    runtime = f"rt-{uuid.uuid4().hex[:6]}"
    named = f"TrainingRuntime {real_namespace}/{runtime}"
    make_runtime(real_admin, real_namespace, runtime)
    queue = None
    if mode == "kueue":
        make_queues(real_admin, real_namespace)
        wait_local_queue_active(real_admin, real_namespace)
        queue = LOCAL_QUEUE
    objects = Objects(real_admin, real_namespace)
    with (
        real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor,
        Adapter(Config(mode=mode), supervisor) as adapter,  # type: ignore[arg-type]
    ):
        body = job(real_namespace, runtime, queue)
        eventually(
            lambda: not created_refused_for_runtime(real_admin, body),
            "Trainer's and Kueue's webhooks see the new runtime",
        )
        ref = adapter.start(body, meta())
        assert adapter.preflight(real_namespace).extra["trainJobRuntimes"].supported
        adapter.open(ref, meta())
        if mode == "kueue":
            eventually(lambda: not objects.suspended(), "Kueue admits and runs the job")
        # The execution has begun (its pods exist) before the hold, so that "no pod" after
        # it means the execution is gone, not that it has not started yet.
        eventually(objects.pods, "the job's pods are made")
        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "the held job is suspended")
        # Plain mode: a Release would meet PodsRemain first while the held execution's
        # pods are still there (its pod check comes before its write).
        eventually(lambda: not objects.pods(), "the held execution's pods are gone")

        delete_runtime(real_admin, real_namespace, runtime)
        refusal = eventually(
            lambda: update_refused_for_runtime(real_admin, ref, runtime),
            "Trainer's webhook sees the runtime gone",
        )
        assert runtime in refusal

        cap = adapter.preflight(real_namespace).extra["trainJobRuntimes"]
        assert not cap.supported and f"TrainJob {real_namespace}/job names {named}" in cap.reason

        with pytest.raises(RuntimeMissing) as caught:
            adapter.release(ref, meta(1))
        assert caught.value.runtime == named
        assert f"{named} does not exist" in str(caught.value)
        assert f"Re-create {named}" in str(caught.value)
        if mode == "plain":  # the webhook's own words are kept (Trainer's or Kueue's)
            assert "The API server said: " in str(caught.value)
            assert runtime_refusal(str(caught.value), runtime)
        observed = adapter.observe(ref)
        assert observed.state is State.HELD and observed.hold_instance == 1, observed

        make_runtime(real_admin, real_namespace, runtime)
        eventually(
            lambda: update_refused_for_runtime(real_admin, ref, runtime) is None,
            "Trainer's webhook sees the runtime again",
        )
        assert adapter.release(ref, meta(1)).warnings == ()
        assert adapter.observe(ref).state is not State.HELD


def evicted(workload: dict[str, Any] | None) -> bool:
    """Kueue has evicted the Workload (its Evicted condition is True)."""
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Evicted" and c.get("status") == "True" for c in conditions)


def kueue_refused_for(cluster: LocalCluster, runtime: str) -> str | None:
    """The line of Kueue's log where one of its reconciles failed on the webhooks' refusal
    for ``runtime`` (a unique name), or None."""
    return next(
        (line for line in kueue_log(cluster) if "Reconciler error" in line and runtime in line),
        None,
    )


def test_a_kueue_hold_of_a_running_trainjob_whose_runtime_is_gone_is_refused_and_named(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, real_namespace: str
) -> None:
    """Kueue mode: a Hold stops a running job through Kueue, which suspends the TrainJob on
    eviction, and that suspend is a TrainJob update the webhooks refuse once the runtime is
    gone. So the Hold of a running job whose runtime is gone raises ``RuntimeMissing`` and
    writes nothing: a Workload made inactive would report a hold while the pods ran on.

    The negative control does what the Hold used to (the Workload made inactive, as the
    admin): Kueue evicts the Workload, and its suspend of the TrainJob is refused, so the
    job's pods are still there after the eviction. With the runtime made again, the same
    Hold stops the job."""
    runtime = f"rt-{uuid.uuid4().hex[:6]}"
    named = f"TrainingRuntime {real_namespace}/{runtime}"
    make_runtime(real_admin, real_namespace, runtime)
    make_queues(real_admin, real_namespace)
    wait_local_queue_active(real_admin, real_namespace)
    objects = Objects(real_admin, real_namespace)
    with (
        real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor,
        Adapter(Config(mode="kueue"), supervisor) as adapter,
    ):
        body = job(real_namespace, runtime, LOCAL_QUEUE)
        eventually(
            lambda: not created_refused_for_runtime(real_admin, body),
            "Trainer's and Kueue's webhooks see the new runtime",
        )
        ref = adapter.start(body, meta())
        adapter.open(ref, meta())
        eventually(lambda: not objects.suspended(), "Kueue admits and runs the job")
        eventually(objects.pods, "the job's pods are made")

        delete_runtime(real_admin, real_namespace, runtime)
        eventually(
            lambda: update_refused_for_runtime(real_admin, ref, runtime),
            "Trainer's webhook sees the runtime gone",
        )
        before = objects.workload()
        assert before is not None
        with pytest.raises(RuntimeMissing) as caught:
            adapter.hold(ref, meta(1), "node lost")
        assert caught.value.runtime == named
        assert f"hold {ref} instance 1" in str(caught.value)
        assert f"Re-create {named}" in str(caught.value)
        after = objects.workload()
        assert after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["spec"].get("active", True) is True

        # The negative control: the Workload made inactive, as the Hold used to do.
        k8s.CustomObjectsApi(real_admin).patch_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, real_namespace, WORKLOAD.plural,
            after["metadata"]["name"], {"spec": {"active": False}},
        )  # fmt: skip
        eventually(lambda: evicted(objects.workload()), "Kueue evicts the inactive Workload")
        # Kueue's reconciler then suspends the TrainJob; the update is refused for the
        # runtime, and Kueue logs the error and retries. Waiting for that line is waiting
        # for Kueue's attempt, not for time: after it the TrainJob still runs.
        refused = eventually(
            lambda: kueue_refused_for(real_cluster, runtime), "Kueue's suspend is refused"
        )
        assert "Reconciler error" in refused, refused
        assert not objects.suspended(), "Kueue suspended a TrainJob whose runtime is gone"
        assert objects.pods(), "the pods went although nothing could suspend the TrainJob"

        make_runtime(real_admin, real_namespace, runtime)
        eventually(
            lambda: update_refused_for_runtime(real_admin, ref, runtime) is None,
            "Trainer's webhook sees the runtime again",
        )
        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "the held job is suspended")
        eventually(lambda: not objects.pods(), "the held execution's pods are gone")
        observed = adapter.observe(ref)
        assert observed.state is State.HELD and observed.hold_instance == 1, observed
