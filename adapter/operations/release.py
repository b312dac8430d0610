"""Release: lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force."""

from __future__ import annotations

from datetime import datetime

from holdwarden import objects
from holdwarden.adapter import decisions, traps
from holdwarden.adapter.decisions import Decision, Obj
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.held import held_reader, held_resource, instance
from holdwarden.adapter.operations.reads import pods_http, require_runtime
from holdwarden.adapter.operations.write_loop import read_decide_write
from holdwarden.adapter.steps import (
    ApiStatusError,
    Operation,
    Request,
    error_for,
)
from holdwarden.adapter.types import CallMeta, Ref, ReleaseResult


def release(ctx: Context, ref: Ref, meta: CallMeta) -> Operation[ReleaseResult]:
    """Lift hold ``meta.instance``; refuses (StaleHold) unless that instance is in force.

    Returns what the caller must know although the hold was lifted (``ReleaseResult``):
    in Kueue mode, a Workload Kueue itself had deactivated, which Kueue up to v0.19 will
    not queue again (``traps.requeue_blocked``). Kueue mode, before the first write: the
    TrainJob's runtime must exist (one GET), else ``RuntimeMissing`` and nothing is
    written, since Trainer's webhook would refuse Kueue's unsuspend and the gate's
    attempt raise; plain mode learns the same from the webhook's refusal of its write.
    """
    deadline = ctx.deadline(meta)
    number = instance(meta)
    what = f"release {ref} instance {number}"
    # The TrainJob of each read (Kueue mode: read beside the Workload) and the held
    # object of the last decision: Release's result is decided on the read it wrote on.
    trainjobs: list[Obj] = []
    decided: list[Obj] = []
    runtime_checked = False
    # The read the call's last pod check followed, when it found no pod. A retry whose
    # read proves the TrainJob stayed suspended since then writes without listing again
    # (decisions.pod_check_carries_over): under a busy status writer the LIST's round
    # trip between read and write is what made plain-mode Release lose most retries.
    no_pods_after: Obj | None = None

    def decide(held: Obj) -> Operation[Decision]:
        nonlocal no_pods_after, runtime_checked
        pods_remain: bool | None = None
        in_force = objects.hold_instance(held, ctx.annotations) == number
        decided.append(held)
        if ctx.mode == "kueue" and in_force and not runtime_checked and trainjobs:
            runtime_checked = True
            yield from require_runtime(ctx, trainjobs[-1], deadline, what)
        if (
            ctx.mode == "plain"
            and in_force
            and decisions.release_would_unsuspend(held, ctx.annotations)
        ):
            if no_pods_after is not None and decisions.pod_check_carries_over(no_pods_after, held):
                pods_remain = False
            else:
                pods_remain = yield from _pods_remain(ctx, ref, deadline)
                no_pods_after = None if pods_remain else held
        return decisions.decide_release(
            held,
            mode=ctx.mode,
            instance=number,
            annotations=ctx.annotations,
            pods_remain=pods_remain,
        )

    read = yield from held_reader(ctx, ref, deadline, what, trainjobs)
    yield from read_decide_write(ctx, held_resource(ctx), read, decide, deadline, what)
    blocked = traps.requeue_blocked(decided[-1]) if ctx.mode == "kueue" else None
    warnings: tuple[str, ...] = ()
    if blocked is not None:
        workload = objects.name(decided[-1]) or "?"
        warnings = (traps.stranded_advice(ref.namespace, workload, blocked),)
    return ReleaseResult(ref, number, kueue_requeue_blocked=blocked, warnings=warnings)


def _pods_remain(ctx: Context, ref: Ref, deadline: datetime) -> Operation[bool]:
    req = Request("list", "pods", ref.namespace)
    try:
        listed = yield from ctx.send(req, deadline, pods_http(ref, limit=1))
    except ApiStatusError as exc:
        raise error_for(exc, f"list the pods of {ref}") from exc
    return bool(listed.get("items"))
