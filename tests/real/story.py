"""Helpers for the real-controller stories, beside rig/localcluster/realstory.py
(which the demo shares): call metadata, pods by execution, the lost node's timeline and
its loss, and the checks every story ends with (no refusal of a controller, no denial in
their logs)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from holdwarden.adapter import CallMeta
from rig.localcluster import LocalCluster
from rig.localcluster.nodes import ready_status, unreachable_taint
from rig.localcluster.realstory import NotWithin, Objects, controller_refusals, eventually
from tests.real.enforcer import ENFORCER_WEBHOOK, Enforcement
from tests.support.actors import WatchEvent

KEPT_WAITING_S = 30.0
"""How long a Release must not run a job while a lost node's pods exist: 150 of the
gate's resync passes (200 ms here, tests/real/enforcer.py) beside its watch events, so a
gate that counted a Terminating pod as gone, or forgot one at a resync, readmits well
inside it."""


def kueue_log(cluster: LocalCluster) -> list[str]:
    """The lines the cluster's real Kueue has logged so far (none without controllers)."""
    return (
        (cluster.controllers.logs() if cluster.controllers else {}).get("kueue", "")
    ).splitlines()


def meta(instance: int | None = None, seconds: float = 30) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=seconds), instance)


def live_pod_sets(events: list[WatchEvent]) -> list[set[str]]:
    """The set of pod uids that existed after each committed pod change, in order."""
    live: set[str] = set()
    history = []
    for event in events:
        if event.kind != "pod":
            continue
        uid = str(event.obj["metadata"]["uid"])
        if event.type == "DELETED":
            live.discard(uid)
        else:
            live.add(uid)
        history.append(set(live))
    return history


def assert_one_execution_at_a_time(
    events: list[WatchEvent], first: set[str], second: set[str]
) -> None:
    """No moment had pods of both executions (uids ``first`` and ``second``)."""
    for live in live_pod_sets(events):
        assert not (live & first and live & second), "pods of two executions at once"


@dataclass
class Timeline:
    """What happened when, in seconds from the timeline's start (the kubelet's death)."""

    started: float = field(default_factory=time.monotonic)
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.marks.append((what, time.monotonic() - self.started))

    def render(self) -> str:
        return " -> ".join(f"{what} {at:.1f}s" for what, at in self.marks)


def lose_a_node(cluster: LocalCluster, objects: Objects, lost: str, timeline: Timeline) -> None:
    """Kill kwok node ``lost``'s kubelet; wait for what the real node lifecycle then does:
    NotReady, the ``unreachable`` taints, and the taint eviction of the job's pods there
    (each marked on ``timeline``). Fails with the lifecycle's evidence if no eviction."""
    nodes = cluster.nodes
    assert nodes is not None
    nodes.lose(lost)
    timeline.mark("heartbeat stops")
    eventually(lambda: ready_status(nodes.get(lost)) == "Unknown", "the node is NotReady", 180)
    timeline.mark("NotReady (Ready=Unknown)")
    eventually(lambda: unreachable_taint(nodes.get(lost), "NoSchedule"), "the node is tainted", 180)
    timeline.mark("unreachable:NoSchedule taint")
    # Taint eviction: the NoExecute taint, then the pods' deletion after their 5 s
    # toleration. A full-suite run once never got the taint: the controller had passed
    # through its full-disruption mode, after which kube-controller-manager v1.36.3 never
    # taints again at an eviction rate of exactly 1 (test_node_lifecycle.py). The rig's
    # rate is 2 since, so the taint is required again.
    try:
        eventually(
            lambda: unreachable_taint(nodes.get(lost), "NoExecute"), "the NoExecute taint", 120
        )
        timeline.mark("unreachable:NoExecute taint")
        eventually(
            lambda: objects.all_terminating_on(lost), "the lost node's pods are Terminating", 60
        )
        timeline.mark("its pods Terminating (taint eviction)")
    except NotWithin as exc:
        pytest.fail(f"no taint eviction: {exc}\n{nodes.lifecycle_evidence(lost)}")


def assert_no_false_positives(cluster: LocalCluster, enforcement: Enforcement) -> None:
    """The enforcer refused no controller's write, and no controller logged a denial by it.

    Only denials by holdwarden's webhook count: the controllers' own webhooks may refuse
    one another for a moment on a starved machine (JobSet's ``mjob.kb.io`` refused a Job
    whose JobSet its cache did not have yet), which is theirs to retry and not ours.
    """
    refused = controller_refusals(enforcement.audit())
    assert not refused, f"the enforcer refused controllers' writes: {refused}"
    assert cluster.controllers is not None
    denials = {
        name: [
            line
            for line in log.splitlines()
            if "denied the request" in line and ENFORCER_WEBHOOK in line
        ][:5]
        for name, log in cluster.controllers.logs().items()
    }
    assert not any(denials.values()), f"controllers logged denials: {denials}"
