"""Open: mark the TrainJob opened (plain mode: and run it if it waits at its start gate)."""

from __future__ import annotations

from holdwarden.adapter import decisions
from holdwarden.adapter.decisions import Decision, Obj
from holdwarden.adapter.operations.context import Context
from holdwarden.adapter.operations.reads import get
from holdwarden.adapter.operations.write_loop import read_decide_write
from holdwarden.adapter.steps import Operation, no_request
from holdwarden.adapter.types import CallMeta, Ref
from holdwarden.vocabulary import TRAINJOB


def open_(ctx: Context, ref: Ref, meta: CallMeta) -> Operation[None]:
    """Mark the TrainJob opened (plain mode: and run it if it waits at its start gate).
    On a conflict it reads and decides again, so an Open overtaken by a Hold writes only
    the opened mark."""
    deadline = ctx.deadline(meta)
    what = f"open {ref}"

    def read() -> Operation[Obj]:
        return get(ctx, TRAINJOB, ref.namespace, ref.name, deadline, what)

    def decide(trainjob: Obj) -> Operation[Decision]:
        return no_request(
            decisions.decide_open(
                trainjob, mode=ctx.mode, now=ctx.clock(), annotations=ctx.annotations
            )
        )

    yield from read_decide_write(ctx, TRAINJOB, read, decide, deadline, what)
