"""The lost-node story once more, with the held execution's pods in real containers where
they can be: a real node (containerd, runc, kubelet) and one kwok node beside it
(``LocalCluster(pods=True, nodes=1)``), the real Kueue, Trainer, JobSet, kube-scheduler
and kube-controller-manager with the node lifecycle's test timings (docs/testing.md,
"Nodes"), the enforcer and the readmission gate registered as in ``tests/real``.

Kueue mode only, one proof (the node comes back; ``tests/real/test_lost_node.py`` runs
both modes and both proofs on kwok nodes). A TrainJob of two nodes runs one pod on each
node: a required pod anti-affinity on the job's JobSet label, per hostname, set through
the TrainJob's ``runtimePatches``, leaves the scheduler no other placement with two
nodes, for both executions. Its image is the node's own sandbox image (no registry is
reachable), whose program runs until SIGTERM. Then:

1. the kwok node is lost (its kubelet killed): NotReady, tainted, its pod evicted and left
   ``Terminating``, nothing to confirm its end;
2. the supervisor holds the job: the real node's pod really stops (its container's
   process is gone from containerd and from the machine, and the kubelet's confirmation
   removes the pod object);
3. Release while the lost node's pod remains: for KEPT_WAITING_S the job is not
   readmitted (suspended, ``P/attempt`` 1, no new pod) and the gate says why;
4. the proof: the node comes back, its kubelet confirms the pod's end; the job is
   readmitted exactly once (``P/attempt`` 1 -> 2), its second execution runs on both
   nodes again (one pod in a real container), and pods of two executions never existed
   at the same time.

The timeline is printed (seconds from the kubelet's death) and, with the cluster's
start-up, in the run's summary.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import JOBSET_NAME_LABEL
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.images import PAUSE_IMAGE
from rig.localcluster.nodes import ready_status
from rig.localcluster.realnode import NODE_NAME, RealNode
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    PODS_REMAIN,
    Objects,
    eventually,
    make_queues,
    with_requests,
)
from tests.pods.conftest import report
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import (
    KEPT_WAITING_S,
    Timeline,
    assert_no_false_positives,
    assert_one_execution_at_a_time,
    lose_a_node,
    meta,
)
from tests.support.actors import Watcher

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

JOB = "job"
PATCH_MANAGER = "holdwarden.io/lost-node-test"
"""The TrainJob's own runtimePatches entry (Kueue keeps a separate one, by manager)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(controllers=CONTROLLERS, nodes=1, pods=True)
    local.start()
    report(
        f"lost node, real containers: cluster started in {local.startup_seconds:.1f}s "
        + ", ".join(f"{k} {v:.1f}s" for k, v in local.phase_seconds.items())
    )
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def enforced(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(cluster, tmp_path_factory.mktemp("enforcer-lostpod")) as running:
        yield running


def _split_trainjob(namespace: str) -> dict[str, Any]:
    """A suspended TrainJob of two nodes in Kueue's LOCAL_QUEUE whose pods run the
    sandbox image, at most one per node."""
    body = with_requests(trainjob_body(JOB, queue=LOCAL_QUEUE, suspend=True))
    body["metadata"]["namespace"] = namespace
    trainer = body["spec"]["trainer"]
    trainer["numNodes"] = 2
    # Nothing can be pulled here: the image every real node has (imported before its
    # kubelet starts; imagePullPolicy IfNotPresent for a tagged image), which runs
    # until SIGTERM, so a pod ends only when it is stopped.
    trainer["image"] = PAUSE_IMAGE.reference
    trainer["command"] = [PAUSE_IMAGE.entrypoint]
    # Both pods come from one Job template, so only a rule between pods can split them:
    # required anti-affinity on the job's label, one per hostname. With two nodes that is
    # one pod on the real node and one on the kwok node, in either execution. Pods of the
    # other execution never meet it: the gate admits the second only once the first's
    # pods are gone.
    anti_affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {JOBSET_NAME_LABEL: JOB}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    pod_patch = {"template": {"spec": {"affinity": anti_affinity}}}
    body["spec"]["runtimePatches"] = [
        {
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": pod_patch}}]}
                }
            },
        }
    ]
    return body


def _container(pod: k8s.V1Pod) -> str:
    """The id of the pod's one container in containerd, once the kubelet reported it."""
    statuses = (pod.status.container_statuses if pod.status else None) or []
    ids = [str(s.container_id) for s in statuses if s.container_id]
    assert len(ids) == 1, statuses
    prefix = "containerd://"
    assert ids[0].startswith(prefix), ids
    return ids[0].removeprefix(prefix)


def _real_process(node: RealNode, objects: Objects, uids: set[str]) -> tuple[str, str, int]:
    """(pod uid, container id, pid) of the one pod among ``uids`` on the real node, whose
    container's process runs there now."""
    (pod,) = [p for p in objects.pods_on(node.name) if p.metadata and p.metadata.uid in uids]
    assert pod.metadata is not None
    container = _container(pod)
    pid = node.running_tasks().get(container)
    assert pid is not None, (container, node.running_tasks())
    assert Path(f"/proc/{pid}").exists()
    return str(pod.metadata.uid), container, pid


def test_a_lost_node_beside_a_real_one_holds_readmission_until_its_pod_is_gone(
    cluster: LocalCluster, enforced: Enforcement
) -> None:
    assert cluster.node is not None and cluster.nodes is not None
    node, nodes = cluster.node, cluster.nodes
    assert node.name == NODE_NAME
    (kwok,) = nodes.names
    admin = cluster.api_client()
    supervisor = cluster.api_client(SUPERVISOR_IDENTITY)
    namespace = cluster.create_namespace(f"lost-{uuid.uuid4().hex[:8]}", enforced.labels())
    watcher = Watcher(admin, namespace)
    watcher.start()
    try:
        objects = Objects(admin, namespace, JOB)
        make_queues(admin, namespace, [enforced.check_name])
        adapter = Adapter(Config(mode="kueue"), supervisor)
        job = adapter.start(_split_trainjob(namespace), meta())
        adapter.open(job, meta())
        running = eventually(lambda: objects.running_on_nodes(2), "the job's pods run", 180)
        assert sorted(running.values()) == sorted([NODE_NAME, kwok]), running
        # The gate raises A in its own write after the Ready check: pods can run first.
        eventually(lambda: objects.attempt() == "1", "the gate records attempt 1", 60)
        real_uid, container, pid = _real_process(node, objects, set(running))

        timeline = Timeline()
        lose_a_node(cluster, objects, kwok, timeline)
        adapter.hold(job, meta(1), "node lost")
        timeline.mark("Hold")
        eventually(objects.suspended, "the TrainJob is suspended")

        # The real node's pod really stops: its process ends (SIGTERM to the sandbox
        # image's program), containerd has no running task for it, and the kubelet's
        # confirmation removes the pod object.
        eventually(lambda: real_uid not in objects.pod_uids(), "the real node's pod is gone", 120)
        timeline.mark("real node's pod gone (kubelet confirmed)")
        eventually(
            lambda: container not in node.running_tasks() and not Path(f"/proc/{pid}").exists(),
            "the real node's container stopped",
            30,
        )

        def only_lost_left() -> bool:
            pods = objects.pods()
            return bool(pods) and all(p.spec and p.spec.node_name == kwok for p in pods)

        eventually(only_lost_left, "only the lost node's pod is left", 120)
        # Every pod so far is the first execution's. The fence first, so that no pod
        # event already committed is still on its way to the watcher.
        fence = watcher.fence_pods()
        first = {
            str(e.obj["metadata"]["uid"])
            for e in watcher.events()
            if e.kind == "pod" and e.obj["metadata"]["name"] != fence
        }
        observed = adapter.observe(job)
        assert observed.state is State.HELD, observed
        left = {str(p.metadata.name) for p in objects.pods_on(kwok) if p.metadata}
        assert left and left <= set(observed.leftover_pods), (left, observed.leftover_pods)
        assert all(p.metadata and p.metadata.deletion_timestamp for p in objects.pods_on(kwok))

        adapter.release(job, meta(1))
        timeline.mark("Release kept waiting")
        eventually(
            lambda: objects.check_message(enforced.check_name, PODS_REMAIN),
            "the gate says the held execution's pods remain",
        )
        until = time.monotonic() + KEPT_WAITING_S
        while time.monotonic() < until:
            assert objects.suspended(), "readmitted while the lost node's pod remains"
            assert objects.attempt() == "1"
            assert objects.pod_uids() <= first
            time.sleep(1)

        nodes.restore(kwok)
        timeline.mark("proof: node back")
        eventually(lambda: not objects.pods_on(kwok), "the lost node's pod is gone", 180)
        timeline.mark("its pod gone (its kubelet confirmed)")
        eventually(lambda: objects.attempt() == "2", "readmitted: A is 2", 180)
        timeline.mark("readmitted (A=2)")
        second = eventually(
            lambda: (s := objects.running_on_nodes(2)) and set(s) - first and s,
            "the second execution runs on both nodes",
            180,
        )
        timeline.mark("second execution Running")
        assert not set(second) & first, (second, first)
        assert sorted(second.values()) == sorted([NODE_NAME, kwok]), second
        _, again, _ = _real_process(node, objects, set(second))
        assert again != container
        time.sleep(5)  # a second rise would show within a few gate passes
        assert objects.attempt() == "2"
        eventually(lambda: ready_status(nodes.get(kwok)) == "True", "the node is Ready again")
        print(f"lost-node timeline (kueue, node-back, real node beside): {timeline.render()}")
        report(f"lost node, real containers: {timeline.render()}")
        assert_one_execution_at_a_time(watcher.events(), first, set(second))
        assert_no_false_positives(cluster, enforced)
    finally:
        watcher.stop()
        supervisor.close()  # type: ignore[no-untyped-call]
        admin.close()  # type: ignore[no-untyped-call]
