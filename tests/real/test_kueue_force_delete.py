"""Issue 29, trap 4 (the force deletion): Kueue's FailureRecoveryPolicy, on the real Kueue
with a lost kwok node, force-deletes a held job's pod that opted in, and the readmission
gate then counts it gone while its node is still unreachable.

What Kueue v0.19.2 does (``pkg/controller/failurerecovery``, started only when the alpha
feature gate ``FailureRecoveryPolicy`` is on; off by default since v0.15): a pod annotated
``kueue.x-k8s.io/safe-to-forcefully-delete: "true"`` that has a ``deletionTimestamp`` is
reconciled once that timestamp plus one minute has passed (the minute is fixed:
``forcefulTerminationGracePeriod``, with no configuration field); if its node then carries
the ``node.kubernetes.io/unreachable`` taint (any effect), Kueue sets the pod's phase to
``Failed``, adds the condition ``KueueFailureRecovery`` (reason
``KueueForcefullyDeleted``), records an Event with that reason and deletes the pod with a
grace period of 0. The ``deletionTimestamp`` of a graceful deletion is already the moment
of deletion plus the pod's grace period, so the pod goes that grace period plus a minute
after it was deleted.

This cluster is its own: its Kueue runs with the gate on, set in its configuration
(``featureGates``), which the rig also keeps in the ConfigMap ``kueue-system/
kueue-manager-config`` as upstream deploys it. The story:

- a Kueue-mode TrainJob through the readmission gate, its runtime's pod template carrying
  the annotation; its pods run on kwok nodes; preflight's ``kueueForceDelete`` names the
  annotated pods and the gate turned on in that ConfigMap (unsupported, a warning);
- a control pod without the annotation runs on the node that is then lost (its kwok
  killed): the node turns NotReady and gets the ``unreachable`` taints;
- Hold: the job's pods on the lost node stay Terminating (nothing confirms them); the
  control pod is deleted too and stays Terminating. Release at once: the gate keeps the
  job waiting (``P/attempt`` stays 1) while the lost node's pod exists;
- Kueue force-deletes the job's pod on the lost node (its condition, its Event), not
  before its deletionTimestamp plus a minute, while the node is still unreachable and its
  kubelet still dead; the control pod is still there;
- with no pod object left, the gate readmits the job (``P/attempt`` 2, new pods running
  on the healthy nodes) although the lost node may still run the first execution's
  process. That is the trap the preflight warning names.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.config import Config
from holdwarden.vocabulary import (
    CLUSTERTRAININGRUNTIME,
    FAILURE_RECOVERY_FEATURE_GATE,
    KUEUE_CONFIG_MAP,
    SAFE_TO_FORCEFULLY_DELETE_ANNOTATION,
    TRAININGRUNTIME,
    TRAINJOB,
)
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS, TRAINING_RUNTIME
from rig.localcluster.nodes import Nodes, ready_status, unreachable_taint
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    condition,
    eventually,
    make_queues,
    with_requests,
)
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import assert_no_false_positives, meta
from tests.support.actors import Watcher

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

RUNTIME = "torch-forcible"
FORCE_GRACE_S = 60.0
"""Kueue v0.19.2's forcefulTerminationGracePeriod (fixed)."""
POD_GRACE_S = 5
"""The job's pods' terminationGracePeriodSeconds (their runtime's template)."""
RECOVERY_CONDITION = "KueueFailureRecovery"
FORCED_REASON = "KueueForcefullyDeleted"


@pytest.fixture(scope="module")
def force_cluster() -> Iterator[LocalCluster]:
    # Three nodes: one is lost, and the node-lifecycle controller keeps evicting while
    # any node of the zone is up.
    cluster = LocalCluster(
        controllers=CONTROLLERS,
        nodes=3,
        kueue_settings={"featureGates": {FAILURE_RECOVERY_FEATURE_GATE: True}},
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def enforced(
    force_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(force_cluster, tmp_path_factory.mktemp("enforcer-force")) as running:
        yield running


def make_forcible_runtime(admin: k8s.ApiClient, namespace: str) -> None:
    """A TrainingRuntime: the upstream torch-distributed one whose pod templates carry
    the annotation that opts a pod in to Kueue's force deletion."""
    custom = k8s.CustomObjectsApi(admin)
    upstream: Any = custom.get_cluster_custom_object(
        CLUSTERTRAININGRUNTIME.group, CLUSTERTRAININGRUNTIME.version,
        CLUSTERTRAININGRUNTIME.plural, TRAINING_RUNTIME,
    )  # fmt: skip
    spec = upstream["spec"]
    for replicated in spec["template"]["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]
        pod.setdefault("metadata", {}).setdefault("annotations", {})[
            SAFE_TO_FORCEFULLY_DELETE_ANNOTATION
        ] = "true"
        # Kueue's minute counts from the deletionTimestamp, which is the deletion plus
        # this grace: 5 s instead of the default 30 s keeps the wait to what it tests.
        pod.setdefault("spec", {})["terminationGracePeriodSeconds"] = POD_GRACE_S
    custom.create_namespaced_custom_object(
        TRAININGRUNTIME.group, TRAININGRUNTIME.version, namespace, TRAININGRUNTIME.plural,
        {
            "apiVersion": TRAININGRUNTIME.api_version,
            "kind": TRAININGRUNTIME.kind,
            "metadata": {"name": RUNTIME, "labels": upstream["metadata"].get("labels") or {}},
            "spec": spec,
        },
    )  # fmt: skip


def runtime_seen(admin: k8s.ApiClient, body: dict[str, Any]) -> bool:
    """A server-side dry-run create of ``body`` passes Trainer's and Kueue's webhooks,
    which read the runtime through their caches (tests/real/test_trainer_traps.py)."""
    try:
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, body["metadata"]["namespace"], TRAINJOB.plural,
            body, dry_run="All",
        )  # fmt: skip
    except k8s.ApiException as exc:
        if exc.status in (400, 403, 422) and RUNTIME in (exc.body or ""):
            return False
        raise
    return True


def control_pod(admin: k8s.ApiClient, namespace: str, node: str) -> str:
    """A pod bound to ``node`` without the annotation (kwok runs it)."""
    name = "control"
    body = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            node_name=node,
            containers=[k8s.V1Container(name="c", image="kwok-runs-no-image")],
            # Its deletion is the test's own, not the taint eviction's.
            tolerations=[k8s.V1Toleration(operator="Exists")],
        ),
    )
    k8s.CoreV1Api(admin).create_namespaced_pod(namespace, body)
    return name


def pod_or_none(admin: k8s.ApiClient, namespace: str, name: str) -> k8s.V1Pod | None:
    try:
        return k8s.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def forced_events(admin: k8s.ApiClient, namespace: str) -> dict[str, str]:
    """{pod name: note} of Kueue's force-deletion Events (events.k8s.io) in ``namespace``.
    Read as JSON: the client's model refuses Events without an eventTime (core ones)."""
    answer: Any = k8s.EventsV1Api(admin).list_namespaced_event(
        namespace, _preload_content=False, _request_timeout=10
    )
    try:
        found: list[dict[str, Any]] = json.loads(answer.data)["items"]
    finally:
        answer.release_conn()
    return {
        str(e["regarding"]["name"]): str(e.get("note"))
        for e in found
        if e.get("reason") == FORCED_REASON and (e.get("regarding") or {}).get("kind") == "Pod"
    }


def _nodes(cluster: LocalCluster) -> Nodes:
    assert cluster.nodes is not None
    return cluster.nodes


def test_kueue_force_deletes_an_opted_in_pod_on_a_lost_node_and_the_gate_counts_it_gone(
    force_cluster: LocalCluster, enforced: Enforcement
) -> None:
    cluster, nodes = force_cluster, _nodes(force_cluster)
    admin = cluster.api_client()
    supervisor = cluster.api_client(SUPERVISOR_IDENTITY)
    namespace = cluster.create_namespace(f"force-{uuid.uuid4().hex[:8]}", labels=enforced.labels())
    watcher = Watcher(admin, namespace)
    watcher.start()
    objects = Objects(admin, namespace)
    try:
        make_forcible_runtime(admin, namespace)
        make_queues(admin, namespace, [enforced.check_name])
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
        body["metadata"]["namespace"] = namespace
        body["spec"]["runtimeRef"] = {
            "name": RUNTIME,
            "apiGroup": TRAININGRUNTIME.group,
            "kind": TRAININGRUNTIME.kind,
        }
        body["spec"]["trainer"]["numNodes"] = 2
        eventually(lambda: runtime_seen(admin, body), "the webhooks see the new runtime")
        adapter = Adapter(Config(mode="kueue"), supervisor)
        ref = adapter.start(body, meta())
        adapter.open(ref, meta())
        running = eventually(
            lambda: objects.running_on_nodes(2), "the job's pods run on kwok nodes", 180
        )
        eventually(lambda: objects.attempt() == "1", "A is 1")
        first = set(running)
        opted_in = sorted(
            str(p.metadata.name)
            for p in objects.pods()
            if p.metadata is not None
            and (p.metadata.annotations or {}).get(SAFE_TO_FORCEFULLY_DELETE_ANNOTATION) == "true"
        )
        assert len(opted_in) == 2, "the runtime's annotation reaches the job's pods"

        # Preflight warns before anything happens: the annotated pods, and the gate on.
        warned = adapter.preflight(namespace).extra["kueueForceDelete"]
        print(f"preflight kueueForceDelete: {warned}")
        assert not warned.supported, warned
        assert all(name in warned.reason for name in opted_in), warned
        assert f"{KUEUE_CONFIG_MAP}'s" in warned.reason, warned
        assert f"turns on the {FAILURE_RECOVERY_FEATURE_GATE} feature gate" in warned.reason
        # The configuration has a featureGates mapping, so no flag can be in play: nothing
        # is left unseen.
        assert "not seen" not in warned.reason, warned

        lost = sorted(set(running.values()))[0]
        on_lost = {str(p.metadata.name) for p in objects.pods_on(lost) if p.metadata}
        control = control_pod(admin, namespace, lost)

        def control_running() -> bool:
            pod = pod_or_none(admin, namespace, control)
            return pod is not None and pod.status is not None and pod.status.phase == "Running"

        eventually(control_running, "the control pod runs on the node to be lost", 120)

        began = time.monotonic()
        nodes.lose(lost)
        eventually(lambda: ready_status(nodes.get(lost)) == "Unknown", "the node is NotReady", 180)
        eventually(
            lambda: unreachable_taint(nodes.get(lost), "NoSchedule"), "the unreachable taint", 180
        )
        print(f"node {lost} unreachable after {time.monotonic() - began:.1f}s")

        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "the held TrainJob is suspended")
        k8s.CoreV1Api(admin).delete_namespaced_pod(control, namespace)
        eventually(
            lambda: objects.all_terminating_on(lost), "the lost node's job pods Terminating", 120
        )
        deleted_at: dict[str, datetime] = {
            str(p.metadata.name): p.metadata.deletion_timestamp
            for p in objects.pods_on(lost)
            if p.metadata is not None and p.metadata.deletion_timestamp is not None
        }
        print(f"deletionTimestamps on {lost}: {deleted_at}")

        # Release now: the gate keeps the job waiting while the lost node's pod exists,
        # as for any lost node (tests/real/test_lost_node.py), until Kueue deletes it.
        adapter.release(ref, meta(1))
        waited_polls = [0]

        def forced_gone() -> bool:
            attempt = objects.attempt()  # read first: readmission comes only after
            remaining = objects.pods_on(lost)
            if remaining:
                assert attempt == "1", f"readmitted while {lost}'s pods exist: A={attempt}"
                waited_polls[0] += 1
            return not remaining

        # The pods' grace (POD_GRACE_S), Kueue's minute, and a busy machine's slack.
        eventually(forced_gone, "Kueue force-deletes the opted-in pods on the lost node", 300)
        gone = datetime.now(next(iter(deleted_at.values())).tzinfo)
        print(f"job pods on {lost} gone after {time.monotonic() - began:.1f}s")
        for name, when in deleted_at.items():
            waited = (gone - when).total_seconds()
            assert waited >= FORCE_GRACE_S - 2, f"{name} went {waited:.0f}s after its timestamp"

        # It was Kueue, by the annotation, on the unreachable node.
        events = eventually(
            lambda: (
                on_lost <= set(forced_events(admin, namespace)) and forced_events(admin, namespace)
            ),
            "Kueue's KueueForcefullyDeleted Events",
            60,
        )
        print(f"Kueue's Events: {events}")
        last_states = {
            str(e.obj["metadata"]["name"]): e.obj
            for e in watcher.events()
            if e.kind == "pod" and e.type == "MODIFIED"
        }
        for name in on_lost:
            recovered = condition(last_states.get(name), RECOVERY_CONDITION)
            assert recovered and recovered["reason"] == FORCED_REASON, last_states.get(name)
            assert last_states[name]["status"]["phase"] == "Failed"
        assert lost in nodes.lost(), "the node came back: nothing proves its processes gone"
        assert ready_status(nodes.get(lost)) == "Unknown"
        still = pod_or_none(admin, namespace, control)
        assert still is not None and still.metadata is not None, "the control pod went too"
        assert still.metadata.deletion_timestamp is not None
        assert SAFE_TO_FORCEFULLY_DELETE_ANNOTATION not in (still.metadata.annotations or {})

        # The gate counts the pods as gone: the released job is readmitted while the node
        # is still lost and may still run the first execution.
        assert waited_polls[0] > 0
        second = eventually(
            lambda: objects.running_on_nodes(2), "the job runs again on the healthy nodes", 180
        )
        assert not set(second) & first
        assert all(node != lost for node in second.values())
        # The gate raises A in a write of its own after the Ready check that let Kueue
        # admit the job, so pods can run before it lands (seen once on quiet cores).
        eventually(lambda: objects.attempt() == "2", "the gate records attempt 2", 60)
        assert lost in nodes.lost() and ready_status(nodes.get(lost)) == "Unknown"
        assert pod_or_none(admin, namespace, control) is not None
        assert_no_false_positives(cluster, enforced)
    finally:
        for name in nodes.lost():
            nodes.restore(name)
        watcher.stop()
        supervisor.close()  # type: ignore[no-untyped-call]
        admin.close()  # type: ignore[no-untyped-call]
