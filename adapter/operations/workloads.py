"""Finding a TrainJob's Workload (Kueue mode), and the cache that spares the search.

The cache maps a TrainJob (``Ref``) to its uid and its Workload's name
(``Context.workloads``). A cached Workload is trusted only while its controller
ownerReference names the TrainJob's uid and it is not being deleted
(``live_workload_of``); otherwise it is found again.
"""

from __future__ import annotations

from datetime import datetime

from holdwarden import objects
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import AdapterError, NotFound, Rejected
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.reads import get, get_request, got, uid
from holdwarden.adapter.steps import (
    ApiStatusError,
    Http,
    Operation,
    Request,
    custom_path,
    error_for,
)
from holdwarden.adapter.types import Ref
from holdwarden.vocabulary import TRAINJOB, WORKLOAD


def live_workload_of(workload: Obj, trainjob_uid: str) -> bool:
    """Whether ``workload`` is the Workload of the TrainJob with ``trainjob_uid``: its
    controller ownerReference names that uid (the label alone is not enough), and it is not
    being deleted."""
    return objects.controlled_by(workload, trainjob_uid) and not objects.is_deleting(workload)


def read_pair(
    ctx: Context, ref: Ref, cached: tuple[str, str], deadline: datetime, what: str
) -> Operation[tuple[Obj, Obj | None]]:
    """The TrainJob and its cached Workload, read at once. The TrainJob's error comes
    first (its absence is the call's NotFound). The Workload is None when it is gone,
    or no longer the cached TrainJob's (the caller rediscovers)."""
    namespace = ref.namespace
    tj_answer, wl_answer = yield from ctx.send_all(
        [
            get_request(TRAINJOB, namespace, ref.name),
            get_request(WORKLOAD, namespace, cached[1]),
        ],
        deadline,
    )
    trainjob = got(tj_answer, TRAINJOB, namespace, ref.name, what)
    if isinstance(wl_answer, ApiStatusError) and wl_answer.status == 404:
        return trainjob, None
    workload = got(wl_answer, WORKLOAD, namespace, cached[1], "")
    if cached[0] != uid(trainjob) or not live_workload_of(workload, cached[0]):
        return trainjob, None
    return trainjob, workload


def workload_for(
    ctx: Context, ref: Ref, trainjob: Obj | None, deadline: datetime | None
) -> Operation[Obj | None]:
    """The TrainJob's Workload, from the cache (one GET) or by discovery.

    A cached Workload is used only if it still has a controller ownerReference to the
    cached TrainJob uid (and, when ``trainjob`` was read, that uid is the TrainJob's)
    and is not being deleted; otherwise the cache entry is dropped and rediscovered.
    """
    cached = ctx.workloads.get(ref)
    trainjob_uid = uid(trainjob) if trainjob is not None else None
    if cached is not None and (trainjob_uid is None or cached[0] == trainjob_uid):
        workload: Obj | None
        try:
            workload = yield from get(ctx, WORKLOAD, ref.namespace, cached[1], deadline, "")
        except NotFound:
            workload = None
        if workload is not None and live_workload_of(workload, cached[0]):
            return workload
    ctx.workloads.pop(ref, None)
    if trainjob is None:
        trainjob = yield from get(ctx, TRAINJOB, ref.namespace, ref.name, deadline, f"{ref}")
        trainjob_uid = uid(trainjob)
    assert trainjob_uid is not None
    return (yield from discover_workload(ctx, ref, trainjob_uid, deadline))


def discover_workload(
    ctx: Context, ref: Ref, trainjob_uid: str, deadline: datetime | None, by_label: bool = True
) -> Operation[Obj | None]:
    """The live Workload the TrainJob with ``trainjob_uid`` controls, or None; remembered
    for the next call.

    First a GET of each name Kueue gives it (``objects.kueue_workload_names``): its
    cost does not grow with the namespace, where the label-selected LIST makes the
    apiserver filter every Workload there (at 100,000 Workloads, 1,000 concurrent
    Holds' LISTs overran their deadlines). Only when no predicted name holds the
    TrainJob's Workload does the LIST run (unless ``by_label`` is false), so a Workload
    named otherwise (another Kueue version, workload slicing) is still found."""
    workload = yield from _by_kueue_name(ctx, ref, trainjob_uid, deadline)
    if workload is None and by_label:
        workload = yield from _by_label(ctx, ref, trainjob_uid, deadline)
    if workload is None:
        return None
    # A list response's items carry no apiVersion/kind; a write's body needs them.
    workload.setdefault("apiVersion", WORKLOAD.api_version)
    workload.setdefault("kind", WORKLOAD.kind)
    ctx.workloads[ref] = (trainjob_uid, str(objects.name(workload)))
    return workload


def _by_kueue_name(
    ctx: Context, ref: Ref, trainjob_uid: str, deadline: datetime | None
) -> Operation[Obj | None]:
    """The TrainJob's live Workload under a name Kueue would give it, or None. An API
    error of these GETs (404, or 403 for a role with ``list`` but not ``get``) is a
    miss for the LIST to settle; a transport failure or a passed deadline is the
    call's."""
    names = objects.kueue_workload_names(ref.name, trainjob_uid)
    answers = yield from ctx.send_all(
        [get_request(WORKLOAD, ref.namespace, name) for name in names], deadline
    )
    for answer in answers:
        if isinstance(answer, AdapterError):
            raise answer
        if isinstance(answer, dict) and live_workload_of(answer, trainjob_uid):
            return answer
    return None


def _by_label(
    ctx: Context, ref: Ref, trainjob_uid: str, deadline: datetime | None
) -> Operation[Obj | None]:
    """List Workloads labelled job-uid=<uid> and keep the one the TrainJob controls."""
    req = Request("list", WORKLOAD.plural, ref.namespace)
    http = Http(
        "GET",
        custom_path(WORKLOAD, ref.namespace),
        query=(("labelSelector", objects.job_uid_selector(trainjob_uid)),),
    )
    try:
        listed = yield from ctx.send(req, deadline, http)
    except ApiStatusError as exc:
        raise error_for(exc, f"find the Workload of {ref}") from exc
    owned = [w for w in listed.get("items") or [] if live_workload_of(w, trainjob_uid)]
    if not owned:
        return None
    if len(owned) > 1:
        names = sorted(str(objects.name(w)) for w in owned)
        raise Rejected(f"{ref} has several Workloads {names}; refusing to guess")
    workload: Obj = owned[0]
    return workload


def forget_workload(ctx: Context, namespace: str, name: str) -> None:
    """Drop every cache entry naming Workload ``namespace/name`` (it was not found)."""
    for ref, (_, cached) in list(ctx.workloads.items()):
        if ref.namespace == namespace and cached == name:
            ctx.workloads.pop(ref, None)
