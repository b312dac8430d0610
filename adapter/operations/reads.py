"""Reads every operation uses: the GET of one object, what a ``send_all`` answer holds, and
the check that a TrainJob's runtime exists (Hold and Release)."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

from holdwarden import objects
from holdwarden.adapter import traps
from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import AdapterError, RuntimeMissing
from holdwarden.adapter.operations.context import Answer, Context
from holdwarden.adapter.steps import (
    ApiStatusError,
    Http,
    Operation,
    Request,
    custom_path,
    error_for,
)
from holdwarden.adapter.types import Ref
from holdwarden.vocabulary import JOBSET_NAME_LABEL, Resource


def get_request(resource: Resource, namespace: str, name: str) -> tuple[Request, Http]:
    """The GET of one namespaced object, as the request log names it and as it is sent."""
    return (
        Request("get", resource.plural, namespace, name),
        Http("GET", custom_path(resource, namespace, name)),
    )


def get_what(resource: Resource, namespace: str, name: str) -> str:
    return f"get {resource.kind} {namespace}/{name}"


def got(answer: Answer, resource: Resource, namespace: str, name: str, what: str) -> Obj:
    """The object a ``send_all`` answer holds, or the error a lone GET of it would raise
    (``what`` names the call; empty: the GET itself)."""
    if isinstance(answer, ApiStatusError):
        raise error_for(answer, what or get_what(resource, namespace, name)) from answer
    if isinstance(answer, AdapterError):
        raise answer
    return answer


def get(
    ctx: Context,
    resource: Resource,
    namespace: str,
    name: str,
    deadline: datetime | None,
    what: str,
) -> Operation[Obj]:
    """GET one object; an API error is the adapter's (``what`` names the call; empty:
    the GET itself)."""
    req, http = get_request(resource, namespace, name)
    try:
        return (yield from ctx.send(req, deadline, http))
    except ApiStatusError as exc:
        raise error_for(exc, what or get_what(resource, namespace, name)) from exc


def uid(obj: Obj) -> str:
    """The uid of an object the API server sent (it always has one)."""
    found = objects.uid(obj)
    if found is None:
        raise AdapterError(f"{objects.name(obj)}: the API server sent an object with no uid")
    return found


def pods_http(ref: Ref, *, limit: int | None = None) -> Http:
    """The LIST of the TrainJob's pods (by the JobSet name label)."""
    query: tuple[tuple[str, str], ...] = (("labelSelector", f"{JOBSET_NAME_LABEL}={ref.name}"),)
    if limit is not None:
        query += (("limit", str(limit)),)
    return Http("GET", f"/api/v1/namespaces/{quote(ref.namespace, safe='')}/pods", query)


def require_runtime(ctx: Context, trainjob: Obj, deadline: datetime, what: str) -> Operation[None]:
    """Raise RuntimeMissing when the runtime the TrainJob names is not found (404).
    Any other answer (found, or a refusal of the GET: no right to read runtimes) lets
    the call go on: only a runtime seen missing stops it."""
    runtime = traps.runtime_of(trainjob)
    if runtime is None:
        return
    resource = runtime.resource
    req = Request("get", resource.plural, runtime.namespace or "", runtime.name)
    http = Http("GET", custom_path(resource, runtime.namespace, runtime.name))
    try:
        yield from ctx.send(req, deadline, http)
    except ApiStatusError as exc:
        if exc.status == 404:
            raise RuntimeMissing(
                traps.runtime_missing_message(what, runtime, ""), str(runtime)
            ) from exc
