"""Hold: place hold ``meta.instance`` on the held object (see the spec's conflict rules)."""

from __future__ import annotations

from holdwarden import objects
from holdwarden.adapter import decisions
from holdwarden.adapter.decisions import Decision, Obj
from holdwarden.adapter.errors import Invalid
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.held import held_reader, held_resource, instance
from holdwarden.adapter.operations.reads import require_runtime
from holdwarden.adapter.operations.write_loop import read_decide_write
from holdwarden.adapter.steps import Operation
from holdwarden.adapter.types import CallMeta, Ref


def hold(ctx: Context, ref: Ref, meta: CallMeta, reason: str) -> Operation[None]:
    """Place hold ``meta.instance`` (see the spec's conflict rules).

    Kueue mode, before the first write, when the TrainJob is not suspended (Kueue must
    suspend it for the hold to stop anything): the TrainJob's runtime must exist (one
    GET), else ``RuntimeMissing`` and nothing is written. Trainer's webhook (and Kueue's)
    refuse every update of a TrainJob whose runtime is gone, Kueue's suspend on eviction
    included: a Workload made inactive would report a hold while the pods kept running.
    Plain mode learns the same from the webhooks' refusal of its own write.
    """
    deadline = ctx.deadline(meta)
    number = instance(meta)
    if not isinstance(reason, str) or len(reason) > decisions.MAX_REASON_LENGTH:
        raise Invalid(f"reason must be text of at most {decisions.MAX_REASON_LENGTH} chars")
    what = f"hold {ref} instance {number}"
    # What the last conflicted try read: decide_hold's conflict rules need it.
    conflicted: list[Obj] = []
    # Kueue mode: the TrainJob read beside each Workload read (held_reader fills it).
    trainjobs: list[Obj] = []
    runtime_checked = False

    def decide(held: Obj) -> Operation[Decision]:
        nonlocal runtime_checked
        decision = decisions.decide_hold(
            held,
            mode=ctx.mode,
            instance=number,
            reason=reason,
            holder=ctx.config.holder,
            now=ctx.clock(),
            annotations=ctx.annotations,
            last_seen_instance=(
                objects.hold_instance_text(conflicted[-1], ctx.annotations) if conflicted else None
            ),
            after_conflict=bool(conflicted),
        )
        if (
            ctx.mode == "kueue"
            and decision.body is not None
            and not runtime_checked
            and trainjobs
            and not objects.suspended(trainjobs[-1])
        ):
            runtime_checked = True
            yield from require_runtime(ctx, trainjobs[-1], deadline, what)
        return decision

    read = yield from held_reader(ctx, ref, deadline, what, trainjobs)
    yield from read_decide_write(
        ctx, held_resource(ctx), read, decide, deadline, what, on_conflict=conflicted.append
    )
