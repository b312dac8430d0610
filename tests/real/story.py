"""Helpers for the real-controller stories, beside rig/localcluster/realstory.py
(which the demo shares): call metadata, pods by execution, and the checks every story
ends with (no refusal of a controller, no denial in their logs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adapter import CallMeta
from rig.localcluster import LocalCluster
from rig.localcluster.realstory import controller_refusals
from tests.actors import WatchEvent
from tests.real.enforcer import ENFORCER_WEBHOOK, Enforcement


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
