"""Observe: classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""

from __future__ import annotations

from dataclasses import replace

from holdwarden import objects
from holdwarden.adapter import decisions, traps
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.reads import get, pods_http
from holdwarden.adapter.operations.workloads import workload_for
from holdwarden.adapter.steps import ApiStatusError, Operation, Request, api_message
from holdwarden.adapter.types import Observation, Ref
from holdwarden.vocabulary import TRAINJOB


def observe(ctx: Context, ref: Ref) -> Operation[Observation]:
    """Classify the TrainJob (and its Workload in Kueue mode). Sends no writes."""
    what = f"observe {ref}"
    trainjob = yield from get(ctx, TRAINJOB, ref.namespace, ref.name, None, what)
    workload: Obj | None = None
    if ctx.mode == "kueue":
        workload = yield from workload_for(ctx, ref, trainjob, None)
    observation = decisions.classify(
        trainjob, workload, mode=ctx.mode, annotations=ctx.annotations, ref=ref
    )
    pods, pods_error = yield from _list_pods(ctx, ref)
    return replace(
        observation,
        leftover_pods=decisions.leftover_pods(observation.state, pods),
        pods_error=pods_error,
        kueue_requeue_blocked=traps.requeue_blocked(workload) if workload else None,
        workload_active=objects.active(workload) if workload else True,
    )


def _list_pods(ctx: Context, ref: Ref) -> Operation[tuple[list[Obj], str | None]]:
    """The TrainJob's pods, as plain dicts, or the reason they could not be listed.

    Observe reports, it does not fail: a supervisor without ``list pods`` still gets
    the state, and the reason the pod facts are missing.
    """
    req = Request("list", "pods", ref.namespace)
    try:
        listed = yield from ctx.send(req, None, pods_http(ref))
    except ApiStatusError as exc:
        return [], f"could not list the pods of {ref}: {api_message(exc)}"
    pods: list[Obj] = []
    for pod in listed.get("items") or []:
        pods.append(
            {
                "name": objects.name(pod),
                "deleting": objects.is_deleting(pod),
                "phase": (pod.get("status") or {}).get("phase"),
            }
        )
    return pods, None
