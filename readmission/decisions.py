"""The readmission gate's decision: may Kueue admit this Workload's next execution?

PURE: no I/O. ``decide_readmission`` gets the Workload, its TrainJob and how many pods of
the job remain, and says what to write.

The gate is a Kueue AdmissionCheck. Kueue admits a Workload only when every one of its
checks is ``Ready``; on eviction it puts them back to ``Pending``. The gate marks its check
``Ready`` only when the TrainJob is opened, has not ended, no hold is in force (no hold
instance annotation and ``spec.active`` not false) and no pod of the previous execution
remains. So a Release in Kueue mode cannot run the object while the held execution's pods
are still there (never two executions), and a hold placed at any time keeps the check from
turning Ready.

``P/attempt`` (A, executions started) rises when the gate grants an admission. The granted
number is written *with* the Ready state, in one status update: in the check's message
(``holdwarden: attempt N admitted``) and in a Workload condition of the gate's own
(``P/AttemptGranted``); the TrainJob's A is raised to N afterwards, and only if it is
lower. That keeps A exact when a write fails or the gate stops in between: raising to N is
idempotent, and the condition remembers the grant after Kueue has reset the check on an
eviction (which replaces the check's message: "Reset to Pending after eviction"). Without
the condition, a gate that stopped between the two writes, followed by a hold before the
next leader looked, lost the grant, and the next one reused its number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from holdwarden import objects
from holdwarden.vocabulary import Annotations, parse_hold_instance

Obj = Mapping[str, Any]

# The number is parsed by the one shared parser, so a granted attempt obeys the same int64
# bound as every hold instance and P/attempt (vocabulary.MAX_HOLD_INSTANCE). The suffix is
# optional: messages written before it existed still record their grant.
_GRANTED_RE = re.compile(
    r"holdwarden: attempt ([0-9]+) admitted(?: \(observedGeneration [0-9]+\))?"
)


def _observed(workload: Obj) -> str:
    """`` (observedGeneration N)``: the Workload generation a message was decided on.

    Kueue's ``admissionChecks[]`` entry has no observedGeneration field (the CRD prunes
    unknown fields), so the gate says it in the one field it may write, the message.
    """
    generation = objects.generation(workload)
    return f" (observedGeneration {generation})" if generation is not None else ""


class GateAction(StrEnum):
    NOTHING = "nothing"
    """No write: the check is not ours to decide now, or it already says the right thing."""
    KEEP_PENDING = "keep-pending"
    """Write the check's message (still Pending) so people can see why it waits."""
    MARK_READY = "mark-ready"
    """Write the check Ready with the granted attempt (a Workload status update)."""
    RAISE_ATTEMPT = "raise-attempt"
    """Raise the TrainJob's P/attempt to the attempt the Ready check granted."""


@dataclass(frozen=True)
class GateDecision:
    action: GateAction
    reason: str
    workload: dict[str, Any] | None = None
    """The whole Workload to write to its status subresource (KEEP_PENDING, MARK_READY)."""
    trainjob: dict[str, Any] | None = None
    """The whole TrainJob to write (RAISE_ATTEMPT)."""
    stalled: bool = False
    """The check is Pending on a job free to run by every hold rule (opened, not ended, no
    hold, active) that the gate itself keeps waiting: pods of the previous execution remain,
    a MultiKueue worker has or may have them, or A cannot be read (``why_blocked``). The
    gate counts these for its "waiting too long" alert; a held or unopened job waits by
    design and is not counted."""


@dataclass(frozen=True)
class WorkerCount:
    """What one MultiKueue worker cluster still has of a job dispatched to it.

    On a MultiKueue manager cluster the job's pods run from a mirror copy of its TrainJob
    (same name and namespace) on a worker; the manager has none of them. ``unreachable``
    says why this worker could not be counted (then anything may still run there).
    """

    cluster: str
    pods: int = 0
    mirror: bool = False
    unreachable: str | None = None


def worker_blocker(workers: Sequence[WorkerCount]) -> str | None:
    """Why the worker clusters keep the next execution waiting, or None when none does.

    Invariant: None only when every worker was counted and has neither a pod of the job
    nor its mirror TrainJob (which would still make pods). A worker that could not be
    counted blocks: "pods may remain" is the only safe reading of silence.
    """
    for worker in workers:
        if worker.unreachable is not None:
            return (
                f"MultiKueue worker cluster {worker.cluster!r} could not be counted "
                f"({worker.unreachable}): pods of the previous execution may still run there"
            )
    for worker in workers:
        if worker.pods > 0:
            return (
                f"{worker.pods} pod(s) of the previous execution remain on MultiKueue worker "
                f"cluster {worker.cluster!r}"
            )
    for worker in workers:
        if worker.mirror:
            return (
                f"the TrainJob's mirror copy on MultiKueue worker cluster {worker.cluster!r} "
                "still exists (it can still make pods)"
            )
    return None


def granted_attempt(message: object) -> int | None:
    """The attempt a Ready check of ours granted, read back from its message."""
    if not isinstance(message, str):
        return None
    match = _GRANTED_RE.fullmatch(message)
    return parse_hold_instance(match.group(1)) if match else None


def why_waiting(
    workload: Obj,
    trainjob: Obj | None,
    pods_remaining: int,
    annotations: Annotations,
    workers: Sequence[WorkerCount] | None = None,
) -> str | None:
    """Why the next execution may not be admitted yet, or None when it may.

    ``workers``: for a TrainJob that MultiKueue dispatches (``spec.managedBy``), what each
    worker cluster still has of it; None when not counted. Such a TrainJob is never
    admitted on an uncounted or blocking set of workers: its previous execution ran
    there, not here, and MultiKueue itself does not wait for it to be gone.
    """
    held = why_not_free(workload, trainjob, annotations)
    if held is not None or trainjob is None:
        return held
    return why_blocked(trainjob, pods_remaining, annotations, workers)


def why_not_free(workload: Obj, trainjob: Obj | None, annotations: Annotations) -> str | None:
    """Why the job is not free to run by the hold rules (not found, not opened, ended, held,
    deactivated), or None when it is: the waits that are someone's decision."""
    if trainjob is None:
        return "its TrainJob was not found"
    if objects.opened_at(trainjob, annotations) is None:
        return "the TrainJob has not been opened (it waits at its start gate)"
    ended = objects.ended_reason(trainjob)
    if ended is not None:
        return f"the TrainJob has ended ({ended})"
    instance = objects.hold_instance_text(workload, annotations)
    if instance is not None:
        return f"hold instance {instance} is in force"
    if not objects.active(workload):
        return "the Workload is deactivated (spec.active=false)"
    return None


def why_blocked(
    trainjob: Obj,
    pods_remaining: int,
    annotations: Annotations,
    workers: Sequence[WorkerCount] | None = None,
) -> str | None:
    """Why the gate itself keeps a job that is free to run waiting (its A unreadable, the
    previous execution's pods, MultiKueue's workers), or None when nothing does."""
    if objects.attempt(trainjob, annotations) is None:
        # The adapter refuses to run an object whose count it cannot read; so does the gate.
        return (
            f"annotation {annotations.attempt}={objects.attempt_text(trainjob, annotations)!r}"
            " on the TrainJob is not a decimal integer; fix it by hand"
        )
    if pods_remaining > 0:
        return f"{pods_remaining} pod(s) of the previous execution remain"
    if objects.dispatched_by_multikueue(trainjob):
        if workers is None:
            return "its pods on MultiKueue's worker clusters have not been counted"
        return worker_blocker(workers)
    return None


def decide_readmission(
    workload: Obj,
    trainjob: Obj | None,
    pods_remaining: int,
    *,
    check_names: frozenset[str],
    annotations: Annotations,
    now: datetime,
    workers: Sequence[WorkerCount] | None = None,
) -> GateDecision:
    """What the gate writes for one Workload.

    Invariants: MARK_READY only when ``why_waiting`` is None (so, for a TrainJob that
    MultiKueue dispatches, only on ``workers`` counted and clear), and with the grant's
    condition in the same write; RAISE_ATTEMPT only raises A to the attempt the gate granted
    (the Ready check's message, or its condition after Kueue reset the check), never lowers
    it and never raises it twice for one grant; no new grant while an earlier one is not yet
    on the TrainJob; checks not listed in ``check_names`` are never touched.
    """
    found = objects.admission_check(workload, check_names)
    if found is None:
        return GateDecision(GateAction.NOTHING, "no admission check of ours on this Workload")
    index, check = found
    state = check.get("state")
    # What was granted: the Ready check's message, or the gate's condition, which outlives
    # Kueue's reset of the check. A grant not yet on the TrainJob is recorded first, before
    # anything else is decided, whatever the check's state now.
    granted = max(
        (g for g in (
            granted_attempt(check.get("message")) if state == "Ready" else None,
            objects.recorded_grant(workload, annotations),
        ) if g is not None),
        default=None,
    )  # fmt: skip
    recorded = objects.attempt(trainjob, annotations) if trainjob is not None else None
    if granted is not None and trainjob is not None and recorded is not None and recorded < granted:
        raised = objects.annotated(trainjob, objects.attempt_annotation(annotations, granted))
        return GateDecision(
            GateAction.RAISE_ATTEMPT, f"record attempt {granted} on the TrainJob", trainjob=raised
        )
    if state == "Ready":
        if granted is None or trainjob is None:
            return GateDecision(GateAction.NOTHING, "Ready, nothing granted to record")
        return GateDecision(GateAction.NOTHING, f"attempt {granted} already recorded")
    if state != "Pending":
        # Retry and Rejected belong to Kueue's own bookkeeping.
        return GateDecision(GateAction.NOTHING, f"check state {state!r} is not ours to change")
    waiting = why_not_free(workload, trainjob, annotations)
    stalled = False
    if waiting is None and trainjob is not None:
        waiting = why_blocked(trainjob, pods_remaining, annotations, workers)
        stalled = waiting is not None
    if waiting is not None:
        message = f"holdwarden: waiting: {waiting}{_observed(workload)}"
        if check.get("message") == message:
            return GateDecision(GateAction.NOTHING, waiting, stalled=stalled)
        pending = objects.with_admission_check(workload, index, {"message": message})
        return GateDecision(GateAction.KEEP_PENDING, waiting, workload=pending, stalled=stalled)
    assert trainjob is not None  # why_waiting returns a reason when it is None
    attempt = objects.next_attempt(trainjob, annotations) or 1  # why_waiting: not garbled
    at = objects.format_time(now)
    ready = {
        "state": "Ready",
        "message": f"holdwarden: attempt {attempt} admitted{_observed(workload)}",
        "lastTransitionTime": at,
    }
    grant = objects.granted_condition(annotations, attempt, at)
    updated = objects.with_admission_check(workload, index, ready, condition=grant)
    return GateDecision(GateAction.MARK_READY, f"admit attempt {attempt}", workload=updated)
