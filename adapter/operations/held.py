"""What Hold and Release share: the instance, the read of the held object (the Workload in
Kueue mode, the TrainJob in plain mode) and the capability check before it is written.

Preflight runs lazily, once per namespace, on the first Hold or Release there (bounded by
that call's deadline), after that call's first read (so the call's own errors, e.g. a
missing TrainJob, come first), and is cached in ``Context.preflights``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from holdwarden.adapter.decisions import Obj
from holdwarden.adapter.errors import AdapterError, Invalid, Rejected, Unsupported
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.reads import get, uid
from holdwarden.adapter.operations.workloads import discover_workload, read_pair
from holdwarden.adapter.steps import ApiStatusError, Operation
from holdwarden.adapter.types import CallMeta, Ref
from holdwarden.vocabulary import TRAINJOB, Resource, check_hold_instance


def held_resource(ctx: Context) -> Resource:
    """The kind a hold is written on in this adapter's mode."""
    return ctx.probes.held_resource


def instance(meta: CallMeta) -> int:
    """The call's hold instance, checked before any request (``Invalid`` otherwise)."""
    # The one bound (vocabulary.MAX_HOLD_INSTANCE), checked here, before any request:
    # an instance the enforcer and every parser would call malformed is never written.
    try:
        return check_hold_instance(meta.instance)
    except ValueError as exc:
        raise Invalid(str(exc)) from exc


def held_reader(
    ctx: Context, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None = None
) -> Operation[Callable[[], Operation[Obj]]]:
    """Reads of the held object for one call: the first is ``_first_read`` (which also
    checks preflight), every later one (after a conflict) ``read_held``. With
    ``trainjobs``, the TrainJob of each read is appended to it."""
    first = yield from _first_read(ctx, ref, deadline, what, trainjobs)

    def read() -> Operation[Obj]:
        nonlocal first
        obj, first = first, None
        if obj is not None:
            return obj
        return (yield from read_held(ctx, ref, deadline, what, trainjobs))

    return read


def _first_read(
    ctx: Context, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None
) -> Operation[Obj | None]:
    """A Hold's or Release's first read, then the capability check (cached preflight).

    The call's own errors come first: a missing TrainJob is NotFound, one without a
    Workload is Rejected, whatever preflight would say. A read the API server refused
    (403) is reported as Unsupported when preflight says Hold is not available here
    (that reason names the missing right), else as the refusal. Returns the object
    read, or None when preflight ran just now (it took time: the loop reads again, so
    the decision is made on a fresh read).
    """
    read_error: AdapterError | None = None
    held: Obj | None = None
    try:
        held = yield from read_held(ctx, ref, deadline, what, trainjobs)
    except Rejected as exc:
        cause = exc.__cause__
        if not (isinstance(cause, ApiStatusError) and cause.status == 403):
            raise
        read_error = exc
    if (yield from _require_hold(ctx, ref.namespace, deadline)):
        held = None
    if read_error is not None:
        raise read_error
    return held


def _require_hold(ctx: Context, namespace: str, deadline: datetime) -> Operation[bool]:
    """Raise Unsupported unless Hold is available in ``namespace``; True when the
    (lazy) preflight had to run for it now."""
    result = ctx.preflights.get(namespace)
    ran = result is None
    if result is None:
        if ctx.lazy_preflight == "access":
            result = yield from ctx.probes.run_access(namespace, deadline)
        else:
            result = yield from ctx.probes.run(namespace, deadline)
        ctx.preflights[namespace] = result
    if not result.hold_supported:
        raise Unsupported(result.hold_unsupported_reason or "unknown")
    return ran


def read_held(
    ctx: Context, ref: Ref, deadline: datetime, what: str, trainjobs: list[Obj] | None = None
) -> Operation[Obj]:
    """Read the held object: the Workload (Kueue mode) or the TrainJob (plain mode).
    With ``trainjobs``, the TrainJob read is appended to it."""
    if ctx.mode == "plain":
        trainjob = yield from get(ctx, TRAINJOB, ref.namespace, ref.name, deadline, what)
        if trainjobs is not None:
            trainjobs.append(trainjob)
        return trainjob
    # The TrainJob is read too, every time: only its uid *now* tells whether the
    # cached Workload still belongs to it. A TrainJob deleted and started again under
    # the same name has a new uid, and until the garbage collector removes the old
    # Workload, trusting the cache would hold the dead job's Workload while the new job
    # runs. With the Workload's name cached, both GETs go out at once: a steady-state
    # Kueue-mode Hold costs one read's time, then the PATCH.
    cached = ctx.workloads.get(ref)
    workload: Obj | None = None
    if cached is None:
        trainjob = yield from get(ctx, TRAINJOB, ref.namespace, ref.name, deadline, what)
    else:
        trainjob, workload = yield from read_pair(ctx, ref, cached, deadline, what)
    if trainjobs is not None:
        trainjobs.append(trainjob)
    if workload is None:
        ctx.workloads.pop(ref, None)
        workload = yield from discover_workload(ctx, ref, uid(trainjob), deadline)
    if workload is None:
        raise Rejected(f"{what}: the TrainJob has no Workload (not managed by Kueue yet?)")
    return workload
