"""``holdwarden demo --story lost-node``: the product's own story on nodes, narrated.

A local control plane with the real Kueue, Trainer, JobSet and kube-controller-manager
(node lifecycle on), the real kube-scheduler and three kwok nodes; the enforcer (``holdwarden
serve``) and the readmission gate. A TrainJob runs on two nodes; one node's kubelet dies;
the real node-lifecycle controller marks it unreachable and the taint-eviction controller
deletes its pods, which stay Terminating. The supervisor holds, releases while the lost
node's pods remain (the gate keeps the job waiting), and gives its proof that the
processes are gone: an operator who has confirmed the machine is off force-deletes them.
Only then is the job readmitted, once. ``tests/real/test_demo_real.py`` checks each step.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta
from holdwarden.config import Config
from rig.builders import trainjob_body
from rig.localcluster.cluster import LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.demostage import (
    DEMO_LABEL,
    controllers_unrefused,
    enforcer,
    inject,
    readmission_gate,
    register_webhook,
    say,
    show,
    wait_enforced,
)
from rig.localcluster.nodes import ready_status, unreachable_taint
from rig.localcluster.rbac import SUPERVISOR_IDENTITY
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    PODS_REMAIN,
    NotWithin,
    Objects,
    eventually,
    make_queues,
    with_requests,
)

NODES = 3
WAIT_S = 10.0
"""How long the demo shows the released job waiting on the lost node's pods, once the gate
has said why."""


def _meta(instance: int | None = None) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=30), instance)


def lost_node_story(workdir: Path) -> None:
    """Run the story, narrated with the stage's ``say`` and ``show`` (demostage.py)."""
    began = time.monotonic()

    def at() -> str:
        return f"[{time.monotonic() - began:5.1f}s]"

    with LocalCluster(controllers=CONTROLLERS, nodes=NODES) as cluster:
        assert cluster.nodes is not None
        nodes = cluster.nodes
        print(
            f"   ready in {cluster.startup_seconds:.1f}s: the real {', '.join(CONTROLLERS)}, "
            f"kube-scheduler and {NODES} kwok nodes ({', '.join(nodes.names)})"
        )
        say("The enforcer (holdwarden serve) and the readmission gate (holdwarden gate)")
        with (
            enforcer(workdir) as (url, _ca_bundle, audit_log),
            cluster.api_client() as api,
            readmission_gate(cluster) as check,
            cluster.api_client(SUPERVISOR_IDENTITY) as supervisor_api,
        ):
            register_webhook(api, url)
            inject(cluster, _ca_bundle)
            namespace = cluster.create_namespace("team-a", labels={DEMO_LABEL: "true"})
            wait_enforced(api, namespace)
            make_queues(api, namespace, admission_checks=[check])
            objects = Objects(api, namespace, "llm-pretrain")
            adapter = Adapter(Config(mode="kueue", holder="dispatch"), supervisor_api)

            say("The supervisor starts TrainJob llm-pretrain on two nodes and opens it")
            body = with_requests(trainjob_body("llm-pretrain", namespace=namespace,
                                               queue=LOCAL_QUEUE))  # fmt: skip
            body["spec"]["trainer"]["numNodes"] = 2
            ref = adapter.start(body, _meta())
            adapter.open(ref, _meta())
            running = eventually(lambda: objects.running_on_nodes(2), "the pods run", 180)
            eventually(lambda: objects.attempt() == "1", "the gate records attempt 1")
            for pod in objects.pods():
                if pod.metadata and pod.spec and pod.status:
                    print(f"   pod {pod.metadata.name} {pod.status.phase} on {pod.spec.node_name}")
            lost = sorted(set(running.values()))[0]

            say(f"Node {lost} is lost: its kubelet (kwok) dies")
            began = time.monotonic()
            nodes.lose(lost)
            eventually(lambda: ready_status(nodes.get(lost)) == "Unknown", "NotReady", 120)
            print(f"   {at()} the node-lifecycle controller: Ready=Unknown (NotReady)")
            try:
                eventually(lambda: unreachable_taint(nodes.get(lost), "NoExecute"), "taint", 120)
                print(f"   {at()} taint node.kubernetes.io/unreachable:NoExecute")
                eventually(
                    lambda: objects.all_terminating_on(lost),
                    "the lost node's pods are Terminating",
                    120,
                )  # fmt: skip
            except NotWithin:
                # The story cannot go on; say why the real controllers did not act.
                print(nodes.lifecycle_evidence(lost))
                raise
            print(f"   {at()} the taint-eviction controller deleted its pods: Terminating, "
                  "and nothing can confirm they stopped")  # fmt: skip

            say("The supervisor holds the job (instance 1)")
            adapter.hold(ref, _meta(1), f"node {lost} lost")
            eventually(objects.suspended, "Kueue suspends the TrainJob")
            eventually(
                lambda: all(p.spec and p.spec.node_name == lost for p in objects.pods()),
                "the pods on healthy nodes go",
                120,
            )
            print(f"   {at()} Kueue evicted it; the pods on healthy nodes are gone")
            observed = adapter.observe(ref)
            show("observe", observed.to_dict())

            say("Release while the lost node's pods remain")
            adapter.release(ref, _meta(1))
            message = eventually(
                lambda: objects.check_message(check, PODS_REMAIN),
                "the readmission gate says the previous execution's pods remain",
                120,
            )
            print(f"   {at()} gate: {message}")
            shown = time.monotonic()
            still = True
            while still and time.monotonic() - shown < WAIT_S:
                still = objects.suspended() and objects.attempt() == "1"
                time.sleep(1)
            print(f"   {at()} for {WAIT_S:.0f}s after that: " + (
                "the readmission gate keeps the job waiting" if still
                else "!! the job was readmitted while the lost node's pods remain"))  # fmt: skip

            say("The proof: the machine is confirmed off, its pods are force-deleted")
            core = k8s.CoreV1Api(api)
            for pod in objects.pods_on(lost):
                if pod.metadata and pod.metadata.name:
                    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
            eventually(lambda: objects.attempt() == "2", "readmitted: A is 2", 180)
            print(f"   {at()} the gate readmitted it: attempt (A) is 2")
            second = eventually(lambda: objects.running_on_nodes(2), "it runs again", 180)
            print(f"   {at()} {len(second)} pods of execution 2 run on "
                  f"{', '.join(sorted(set(second.values())))}")  # fmt: skip
            show("observe", adapter.observe(ref).to_dict())
            controllers_unrefused(audit_log)
