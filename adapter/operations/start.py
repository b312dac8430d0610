"""Start: create the TrainJob; in Kueue mode wait, bounded by the deadline, for its Workload."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from holdwarden.adapter import decisions, steps
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import DeadlinePassed, Invalid, Rejected
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.reads import uid
from holdwarden.adapter.operations.workloads import discover_workload
from holdwarden.adapter.steps import (
    FIELD_MANAGER,
    ApiStatusError,
    Http,
    Operation,
    Request,
    custom_path,
    error_for,
)
from holdwarden.adapter.types import CallMeta, Ref
from holdwarden.vocabulary import TRAINJOB

START_POLL_INTERVAL_S = 0.1
# While Start waits for Kueue to make the Workload, each poll GETs the names Kueue gives
# it; only every this many polls (about once a second) does it also LIST by label, for a
# Workload named otherwise, so waiting costs no LIST over the namespace ten times a second.
START_POLLS_PER_LIST = 10


def start(ctx: Context, trainjob: dict[str, Any], meta: CallMeta) -> Operation[Ref]:
    """Create the TrainJob; in Kueue mode wait (bounded by the deadline) for its
    Workload, so every started object has one. On timeout the TrainJob stays created."""
    deadline = ctx.deadline(meta)
    config = ctx.config
    namespace = decisions.needs_namespace_for_start(
        trainjob, manage_jobs_without_queue_name=config.kueue_manage_jobs_without_queue_name
    )
    unlabelled_managed = False
    if namespace:
        labels = yield from _namespace_labels(ctx, namespace, deadline)
        unlabelled_managed = config.kueue_managed_jobs_namespace_selector.matches(labels)
    try:
        body = decisions.validate_start_body(
            trainjob,
            mode=ctx.mode,
            annotations=ctx.annotations,
            kueue_manages_unlabelled=unlabelled_managed,
        )
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    ref = Ref(body["metadata"]["namespace"], body["metadata"]["name"])
    req = Request("create", TRAINJOB.plural, ref.namespace, ref.name)
    http = Http(
        "POST",
        custom_path(TRAINJOB, ref.namespace),
        query=(("fieldManager", FIELD_MANAGER),),
        body=body,
    )
    try:
        created = yield from ctx.send(req, deadline, http)
    except ApiStatusError as exc:
        if exc.status == 409:
            raise Rejected(f"start {ref}: a TrainJob of that name exists") from exc
        raise error_for(exc, f"start {ref}") from exc
    if ctx.mode == "plain":
        return ref
    trainjob_uid = uid(created)
    timed_out = (
        f"start {ref}: the TrainJob was created but its Workload did not appear before the"
        " deadline (is Kueue running and the queue-name label right?)"
    )
    polls = 0
    while True:
        polls += 1
        by_label = polls % START_POLLS_PER_LIST == 0
        try:
            workload = yield from discover_workload(ctx, ref, trainjob_uid, deadline, by_label)
        except DeadlinePassed as exc:
            raise DeadlinePassed(timed_out) from exc
        if workload is not None:
            return ref
        remaining = (deadline - ctx.clock()).total_seconds()
        if remaining <= 0:
            raise DeadlinePassed(timed_out)
        yield from steps.pause(min(START_POLL_INTERVAL_S, remaining))


def _namespace_labels(
    ctx: Context, namespace: str, deadline: datetime
) -> Operation[dict[str, str]]:
    """The labels of Namespace ``namespace`` (Start's question: does Kueue manage a
    TrainJob without a queue name there?)."""
    req = Request("get", "namespaces", "", namespace)
    http = Http("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}")
    try:
        found: Obj = yield from ctx.send(req, deadline, http)
    except ApiStatusError as exc:
        raise error_for(
            exc,
            f"start: reading Namespace {namespace} (kueue.manageJobsWithoutQueueName is true,"
            " so whether Kueue manages a TrainJob without the queue-name label depends on"
            " its labels; grant get on namespaces, or add the label)",
        ) from exc
    labels = (found.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
