"""The lost node, for real: kwok nodes, the real scheduler and the real node lifecycle.

A local control plane with three kwok nodes (``LocalCluster(nodes=3)``): kube-scheduler
binds the pods, kwok plays each node's kubelet (pods ``Running``, Lease heartbeats,
confirmed terminations), and kube-controller-manager runs the node-lifecycle,
taint-eviction and pod-GC controllers beside the Job and garbage-collector ones
(docs/testing.md, "Nodes"). The enforcer and the readmission gate are registered.

The story, in both modes: a TrainJob's pods run on the nodes; one node is lost (its kwok
is killed: no heartbeat, no confirmation); the node-lifecycle controller marks it
unreachable and taints it, and the taint-eviction controller deletes its pods, which stay
``Terminating``. The supervisor holds the job; the pods on healthy nodes go. Release while
the lost node's pods exist is kept waiting (Kueue mode: the gate) or refused (plain mode:
``PodsRemain``) for 30 s. Then the proof that the processes are gone: the Node object is
deleted (pod GC force-deletes its pods), or the node comes back (its kubelet confirms the
terminations). Only then is the job readmitted, once: ``P/attempt`` rises by exactly 1
and pods of two executions never exist at the same time.

Each test prints its timeline as measured (seconds from the kubelet's death).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, Ref
from holdwarden.adapter.errors import PodsRemain
from holdwarden.adapter.types import State
from holdwarden.config import Config
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.nodes import Nodes, ready_status
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    eventually,
    make_queues,
    with_requests,
)
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


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[LocalCluster]:
    # Five: two tests delete the node they lose, and the node-lifecycle controller stops
    # evicting when every node of a zone is down (keep at least two up).
    cluster = LocalCluster(controllers=CONTROLLERS, nodes=5)
    cluster.start()
    try:
        yield cluster
    finally:
        if cluster.nodes is not None:
            print(f"kwok RSS (KiB): {cluster.nodes.rss_kib()}")
        cluster.stop()


@pytest.fixture(scope="module")
def enforced(
    node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(node_cluster, tmp_path_factory.mktemp("enforcer-nodes")) as running:
        yield running


def _nodes(cluster: LocalCluster) -> Nodes:
    assert cluster.nodes is not None
    return cluster.nodes


@dataclass
class Story:
    cluster: LocalCluster
    enforced: Enforcement
    namespace: str
    objects: Objects
    watcher: Watcher
    supervisor: k8s.ApiClient


@pytest.fixture
def story(node_cluster: LocalCluster, enforced: Enforcement) -> Iterator[Story]:
    admin = node_cluster.api_client()
    namespace = node_cluster.create_namespace(
        f"node-{uuid.uuid4().hex[:8]}", labels=enforced.labels()
    )
    watcher = Watcher(admin, namespace)
    watcher.start()
    supervisor = node_cluster.api_client(SUPERVISOR_IDENTITY)
    objects = Objects(admin, namespace)
    try:
        yield Story(node_cluster, enforced, namespace, objects, watcher, supervisor)
    finally:
        # A test that failed with its node lost gives it back: the next one needs nodes.
        for name in _nodes(node_cluster).lost():
            _nodes(node_cluster).restore(name)
        watcher.stop()
        supervisor.close()  # type: ignore[no-untyped-call]
        admin.close()  # type: ignore[no-untyped-call]


def _start(story: Story, mode: str) -> tuple[Adapter, dict[str, str]]:
    adapter = Adapter(Config(mode=mode), story.supervisor)  # type: ignore[arg-type]
    queue = LOCAL_QUEUE if mode == "kueue" else None
    if queue is not None:
        make_queues(story.objects.admin, story.namespace, [story.enforced.check_name])
    body = with_requests(trainjob_body("job", queue=queue, suspend=True))
    body["metadata"]["namespace"] = story.namespace
    body["spec"]["trainer"]["numNodes"] = 2
    ref = adapter.start(body, meta())
    adapter.open(ref, meta())
    running = eventually(
        lambda: story.objects.running_on_nodes(2), "the job's pods run on kwok nodes", 180
    )
    eventually(lambda: story.objects.attempt() == "1", "A is 1")
    return adapter, running


@pytest.mark.parametrize("mode", ["kueue", "plain"])
@pytest.mark.parametrize("proof", ["node-deleted", "node-back"])
def test_a_lost_node_holds_readmission_until_its_pods_are_provably_gone(
    story: Story, mode: str, proof: str
) -> None:
    adapter, running = _start(story, mode)
    job = Ref(story.namespace, "job")
    lost = sorted(set(running.values()))[0]
    timeline = Timeline()
    lose_a_node(story.cluster, story.objects, lost, timeline)

    adapter.hold(job, meta(1), "node lost")
    timeline.mark("Hold")
    eventually(story.objects.suspended, "the TrainJob is suspended")

    def only_lost_left() -> bool:
        pods = story.objects.pods()
        return bool(pods) and all(p.spec and p.spec.node_name == lost for p in pods)

    eventually(only_lost_left, "the pods on healthy nodes go", 120)
    timeline.mark("healthy nodes' pods gone")
    eventually(
        lambda: story.objects.all_terminating_on(lost), "the lost node's pods Terminating", 120
    )
    # Every pod so far is the first execution's (A is 1): those that ran, and those the
    # Job controller made to replace the evicted ones. The fence first, so that no pod
    # event already committed is still on its way to the watcher; the fence pod itself
    # (no job label) is no pod of the job.
    fence = story.watcher.fence_pods()
    first = {
        str(e.obj["metadata"]["uid"])
        for e in story.watcher.events()
        if e.kind == "pod" and e.obj["metadata"]["name"] != fence
    }
    observed = adapter.observe(job)
    assert observed.state is State.HELD, observed
    left = {str(p.metadata.name) for p in story.objects.pods_on(lost) if p.metadata}
    assert left and left <= set(observed.leftover_pods), (left, observed.leftover_pods)
    # What "gone" leans on (docs/explanation/readmission-gate.md): the lost node's pods
    # still say Running,
    # their kubelet's last word, while they wait to be confirmed.
    lost_uids = {str(p.metadata.uid) for p in story.objects.pods_on(lost) if p.metadata}
    assert {p.status.phase for p in story.objects.pods_on(lost) if p.status} == {"Running"}

    if mode == "kueue":
        adapter.release(job, meta(1))
    else:
        with pytest.raises(PodsRemain):
            adapter.release(job, meta(1))
    timeline.mark("Release " + ("kept waiting" if mode == "kueue" else "refused (PodsRemain)"))
    until = time.monotonic() + KEPT_WAITING_S
    while time.monotonic() < until:
        assert story.objects.suspended(), "readmitted while the lost node's pods remain"
        assert story.objects.attempt() == "1"
        assert story.objects.pod_uids() <= first
        time.sleep(1)
    if mode == "plain":
        with pytest.raises(PodsRemain):
            adapter.release(job, meta(1))

    nodes = _nodes(story.cluster)
    if proof == "node-deleted":
        nodes.delete(lost)
        timeline.mark("proof: Node deleted")
    else:
        nodes.restore(lost)
        timeline.mark("proof: node back")
    eventually(lambda: not story.objects.pods_on(lost), "the lost node's pods are gone", 180)
    timeline.mark("its pods gone")
    if mode == "plain":
        # The supervisor's proof is in: it releases again (PodsRemain until now).
        adapter.release(job, meta(1))
    eventually(lambda: story.objects.attempt() == "2", "readmitted: A is 2", 180)
    timeline.mark("readmitted (A=2)")
    second = eventually(
        lambda: (s := story.objects.running_on_nodes(2)) and set(s) - first,
        "the second execution runs",
        180,
    )
    timeline.mark("second execution Running")
    time.sleep(5)  # a second rise would show within a few gate passes
    assert story.objects.attempt() == "2"
    assert not set(second) & first
    print(f"lost-node timeline ({mode}, {proof}): {timeline.render()}")
    print(f"first execution: {len(first)} pods, {len(running)} of them before the loss")
    if proof == "node-back":
        eventually(lambda: ready_status(nodes.get(lost)) == "True", "the node is Ready again")
    if proof == "node-deleted":
        # Pod GC, not a kubelet, ends them: it writes phase Failed, then force-deletes.
        last_words = {
            str(e.obj["metadata"]["uid"]): (e.obj.get("status") or {}).get("phase")
            for e in story.watcher.events()
            if e.kind == "pod"
            and e.type == "MODIFIED"
            and str(e.obj["metadata"]["uid"]) in lost_uids
        }
        assert set(last_words.values()) == {"Failed"}, last_words
    assert_one_execution_at_a_time(story.watcher.events(), first, set(second))
    assert_no_false_positives(story.cluster, story.enforced)
