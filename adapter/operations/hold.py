"""Hold: place hold ``meta.instance`` on the held object (see the spec's conflict rules)."""

from __future__ import annotations

from holdwarden import objects
from holdwarden.adapter import decisions
from holdwarden.adapter.decisions import Decision, Obj
from holdwarden.adapter.errors import Invalid
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.held import held_reader, held_resource, instance
from holdwarden.adapter.operations.write_loop import read_decide_write
from holdwarden.adapter.steps import Operation, no_request
from holdwarden.adapter.types import CallMeta, Ref


def hold(ctx: Context, ref: Ref, meta: CallMeta, reason: str) -> Operation[None]:
    """Place hold ``meta.instance`` (see the spec's conflict rules)."""
    deadline = ctx.deadline(meta)
    number = instance(meta)
    if not isinstance(reason, str) or len(reason) > decisions.MAX_REASON_LENGTH:
        raise Invalid(f"reason must be text of at most {decisions.MAX_REASON_LENGTH} chars")
    what = f"hold {ref} instance {number}"
    # What the last conflicted try read: decide_hold's conflict rules need it.
    conflicted: list[Obj] = []

    def decide(held: Obj) -> Operation[Decision]:
        return no_request(
            decisions.decide_hold(
                held,
                mode=ctx.mode,
                instance=number,
                reason=reason,
                holder=ctx.config.holder,
                now=ctx.clock(),
                annotations=ctx.annotations,
                last_seen_instance=(
                    objects.hold_instance_text(conflicted[-1], ctx.annotations)
                    if conflicted
                    else None
                ),
                after_conflict=bool(conflicted),
            )
        )

    read = yield from held_reader(ctx, ref, deadline, what)
    yield from read_decide_write(
        ctx, held_resource(ctx), read, decide, deadline, what, on_conflict=conflicted.append
    )
