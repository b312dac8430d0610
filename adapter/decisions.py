"""The adapter's decisions, as pure functions: no I/O, no clock, no randomness.

Each decision takes the object just read (a dict as the API server returned it) and the call,
and returns a ``Decision``: either the full modified object to write (it keeps the read's
``metadata.resourceVersion``; the core sends only its difference from the read, as a merge
PATCH carrying that resourceVersion, so the write is preconditioned on the read it was
decided on: adapter/patches.py) or an outcome that needs no write.

The held object is the Workload in Kueue mode and the TrainJob in plain mode. In Kueue mode
no decision here ever writes ``spec.suspend``: Kueue owns that field.

Decisions the spec leaves open (documented in docs/explanation/holds-and-modes.md):

- Hold(m) on a first read that finds an *older* instance in force replaces it (a newer hold
  supersedes); a *newer* instance is ``stale``.
- Hold(m) that finds m's annotation but not the hold field (``active`` true / ``suspend``
  false — only possible without the enforcer) writes the hold again instead of reporting
  success, so a Hold that returns has the object held.
- A malformed hold-instance annotation names no instance. Release(m) treats it as "an
  instance other than m" (``stale``). Hold(m) overwrites it: it cannot be newer than m, and
  refusing would leave an object nobody can release. After a conflict, Hold(m) still
  refuses if the annotation's text differs from the text the previous read saw.
- Release(m) when no hold is in force is ``stale``, word for word ("any other instance, or
  none"), so a repeated Release is refused, not silently accepted.
- Open of an object that was opened before does nothing (Open is idempotent); it never
  unsuspends a held, ended or already-running object, and never lifts a hold.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from holdwarden import objects
from holdwarden.adapter.types import Capability, Observation, Ref, State
from holdwarden.vocabulary import (
    DEACTIVATION_TARGET_CONDITION,
    EVICTED_CONDITION,
    KUEUE_DEACTIVATED_DUE_TO_PREFIX,
    MAX_HOLD_INSTANCE,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    Annotations,
    Mode,
    is_hold_instance,
    parse_hold_instance,
)

Obj = dict[str, Any]

MAX_REASON_LENGTH = 1024
_BAD_INSTANCE = f"hold instance must be an integer in [1, {MAX_HOLD_INSTANCE}], got {{!r}}"
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_RFC1035_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class Outcome(StrEnum):
    WRITE = "write"
    """PUT ``Decision.body`` (preconditioned on the read's resourceVersion)."""
    DONE = "done"
    """Nothing to write: the call's effect is already in place."""
    STALE = "stale"
    """A newer call has overtaken this one (StaleHold)."""
    PODS_REMAIN = "pods-remain"
    """Release would run the object while pods of the job remain."""
    REJECTED = "rejected"
    """The object cannot take this call as it stands (e.g. a garbled attempt annotation)."""
    INVALID = "invalid"
    """The call itself is malformed."""


@dataclass(frozen=True)
class Decision:
    """What to do after one read. ``body`` is set exactly when ``outcome is WRITE``."""

    outcome: Outcome
    body: Obj | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if (self.outcome is Outcome.WRITE) != (self.body is not None):
            raise ValueError("a Decision carries a body exactly when it is a WRITE")


# Kept as names the contract's brief uses; they are one type.
HoldDecision = Decision
ReleaseDecision = Decision
OpenDecision = Decision


# ---- reading an object: holdwarden.objects (one meaning per field, shared) --------------


def release_would_unsuspend(trainjob: Obj, annotations: Annotations) -> bool:
    """Plain mode: Release also unsuspends (and so needs the pod check) only for an opened
    TrainJob that has not ended."""
    return (objects.opened_at(trainjob, annotations) is not None) and objects.ended_reason(
        trainjob
    ) is None


def pod_check_carries_over(checked_after: Obj, now: Obj) -> bool:
    """Plain-mode Release: whether a pod check that found no pod, taken after reading
    ``checked_after``, still speaks for ``now``, a later read of the same TrainJob (a retry's
    read after a conflict), so the retry may write without listing the pods again.

    What a pod check proves in the first place: the list was taken between the read and the
    write, and the write is preconditioned on the read's resourceVersion, so the TrainJob
    stayed suspended from the moment no pod remained until the write. The same holds across
    a conflict when the TrainJob stayed suspended from ``checked_after`` to ``now``: the
    API server raises ``metadata.generation`` on every change outside metadata and status,
    so an equal generation (with ``spec.suspend`` true at both ends) means no write in
    between touched ``spec.suspend``, and nothing could have run the job. The conflicts a
    Release meets are status writes (Trainer's, a heartbeat's), which leave the generation
    alone.

    Invariant: True only for the same object (uid), at the same generation, suspended at
    both reads, and not being deleted; anything else, or anything missing, is False (list
    the pods again).
    """
    uid, generation = objects.uid(checked_after), objects.generation(checked_after)
    return (
        bool(uid)
        and objects.uid(now) == uid
        and generation is not None  # objects.generation: a bool is not one
        and objects.generation(now) == generation
        and objects.suspended(checked_after)
        and objects.suspended(now)
        and not objects.is_deleting(now)
        and not objects.is_deleting(checked_after)
    )


# ---- writing helpers: the writes themselves are holdwarden.objects' ------------------------


def _garbled_attempt(obj: Obj, annotations: Annotations) -> str:
    return (
        f"annotation {annotations.attempt}={objects.attempt_text(obj, annotations)!r} is not a"
        " decimal integer; fix it by hand before the object can run again"
    )


# ---- the decisions -----------------------------------------------------------------------


def decide_hold(
    obj: Obj,
    *,
    mode: Mode,
    instance: int,
    reason: str,
    holder: str,
    now: datetime,
    annotations: Annotations,
    last_seen_instance: str | None = None,
    after_conflict: bool = False,
) -> Decision:
    """Hold(m) on the held object just read.

    ``last_seen_instance`` is the hold-instance text the previous read of this call saw
    (only meaningful when ``after_conflict``). Invariants: a WRITE sets the hold field
    (Workload ``active=false`` / TrainJob ``suspend=true``) and all four hold annotations
    with m; it never removes or lowers a newer instance; in Kueue mode it never touches
    ``spec.suspend``.
    """
    if not is_hold_instance(instance):
        return Decision(Outcome.INVALID, detail=_BAD_INSTANCE.format(instance))
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        return Decision(
            Outcome.INVALID, detail=f"reason must be text of at most {MAX_REASON_LENGTH} chars"
        )
    raw = objects.hold_instance_text(obj, annotations)
    current = parse_hold_instance(raw)
    if current == instance and objects.hold_field_set(obj, mode):
        return Decision(Outcome.DONE, detail=f"hold instance {instance} already in force")
    if current is not None and current > instance:
        return Decision(
            Outcome.STALE, detail=f"newer hold instance {current} is in force (asked {instance})"
        )
    if after_conflict and raw != last_seen_instance:
        return Decision(
            Outcome.STALE,
            detail=(
                f"after a conflict the hold instance in force is {raw!r}, not"
                f" {last_seen_instance!r} as the previous read saw: another hold call moved it"
            ),
        )
    marks = objects.hold_annotations(
        annotations, instance=instance, reason=reason, holder=holder, at=now
    )
    body = objects.annotated(obj, marks)
    spec = body.setdefault("spec", {})
    if mode == "kueue":
        spec["active"] = False
    else:
        spec["suspend"] = True
    return Decision(Outcome.WRITE, body=body, detail=f"place hold instance {instance}")


def decide_release(
    obj: Obj,
    *,
    mode: Mode,
    instance: int,
    annotations: Annotations,
    pods_remain: bool | None = None,
) -> Decision:
    """Release(m) on the held object just read.

    Refuses (STALE) unless the hold-instance annotation names m — before or after a
    conflict alike, as the spec says. Kueue mode: ``active=true`` and the four hold
    annotations removed, nothing else. Plain mode: the annotations removed and, only for an
    opened TrainJob that has not ended, ``suspend=false`` and P/attempt + 1 in the same body
    — and only when ``pods_remain`` is False (True → PODS_REMAIN, nothing written).
    ``pods_remain`` may be None only when ``release_would_unsuspend`` is False.
    """
    if not is_hold_instance(instance):
        return Decision(Outcome.INVALID, detail=_BAD_INSTANCE.format(instance))
    raw = objects.hold_instance_text(obj, annotations)
    current = parse_hold_instance(raw)
    if current != instance:
        in_force = "no hold" if raw is None else f"hold instance {raw!r}"
        return Decision(
            Outcome.STALE, detail=f"{in_force} is in force, not {instance}: refusing to release"
        )
    lifted = objects.annotated(obj, remove=annotations.hold_keys)
    spec = lifted.setdefault("spec", {})
    if mode == "kueue":
        spec["active"] = True
        return Decision(Outcome.WRITE, body=lifted, detail=f"lift hold instance {instance}")
    if not release_would_unsuspend(obj, annotations):
        return Decision(
            Outcome.WRITE,
            body=lifted,
            detail=f"lift hold instance {instance}; stays suspended (not opened, or ended)",
        )
    if pods_remain is None:
        raise ValueError("plain-mode Release of an opened TrainJob needs the pod check")
    if pods_remain:
        return Decision(
            Outcome.PODS_REMAIN,
            detail="pods of the previous execution remain; nothing written, try again later",
        )
    attempt = objects.next_attempt(obj, annotations)
    if attempt is None:
        return Decision(Outcome.REJECTED, detail=_garbled_attempt(obj, annotations))
    body = objects.annotated(lifted, objects.attempt_annotation(annotations, attempt))
    body["spec"]["suspend"] = False
    return Decision(
        Outcome.WRITE, body=body, detail=f"lift hold instance {instance} and run the job again"
    )


def decide_open(
    trainjob: Obj,
    *,
    mode: Mode,
    now: datetime,
    annotations: Annotations,
) -> Decision:
    """Open on the TrainJob just read. Idempotent: once opened, Open writes nothing.

    Writes the opened mark (if absent). In plain mode it also unsuspends and raises
    P/attempt, in the same body, only when the TrainJob is at its start gate: suspended, no
    hold annotation (of any value), not ended. In Kueue mode it writes only the mark (the
    readmission gate raises P/attempt); it never touches ``spec.suspend``.
    """
    if objects.opened_at(trainjob, annotations) is not None:
        return Decision(Outcome.DONE, detail="already opened")
    mark = objects.opened_annotation(annotations, now)
    body = objects.annotated(trainjob, mark)
    if mode == "kueue":
        return Decision(Outcome.WRITE, body=body, detail="mark opened")
    held = objects.hold_instance_text(trainjob, annotations) is not None
    if held or objects.ended_reason(trainjob) is not None or not objects.suspended(trainjob):
        why = "held" if held else "ended" if objects.ended_reason(trainjob) else "not suspended"
        return Decision(Outcome.WRITE, body=body, detail=f"mark opened only ({why})")
    attempt = objects.next_attempt(trainjob, annotations)
    if attempt is None:
        return Decision(Outcome.REJECTED, detail=_garbled_attempt(trainjob, annotations))
    body = objects.annotated(trainjob, {**mark, **objects.attempt_annotation(annotations, attempt)})
    body.setdefault("spec", {})["suspend"] = False
    return Decision(Outcome.WRITE, body=body, detail="mark opened and start the first execution")


def kueue_cause(workload: Obj) -> str | None:
    """Kueue's own reason for deactivating, or None.

    From an ``Evicted`` condition whose reason is ``DeactivatedDueTo<Cause>`` (→ Cause), or
    from a True ``DeactivationTarget`` condition (→ its reason: Kueue is deactivating).
    Reason exactly ``Deactivated`` is someone else's deactivation and yields None.
    """
    evicted = objects.condition(workload, EVICTED_CONDITION)
    if evicted is not None and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or "")
        if reason.startswith(KUEUE_DEACTIVATED_DUE_TO_PREFIX) and len(reason) > len(
            KUEUE_DEACTIVATED_DUE_TO_PREFIX
        ):
            return reason[len(KUEUE_DEACTIVATED_DUE_TO_PREFIX) :]
    target = objects.condition(workload, DEACTIVATION_TARGET_CONDITION)
    if target is not None and target.get("status") == "True":
        return str(target.get("reason") or DEACTIVATION_TARGET_CONDITION)
    return None


def classify(
    trainjob: Obj,
    workload: Obj | None,
    *,
    mode: Mode,
    annotations: Annotations,
    ref: Ref,
) -> Observation:
    """Observe: classify a TrainJob (and its Workload in Kueue mode). No writes.

    Precedence: ended; held; deactivated by Kueue; deactivated by someone else (Kueue
    mode: Workload inactive); running (TrainJob not suspended); at the start gate (not
    opened); then, opened and suspended: deactivated by someone else (plain mode) or
    waiting for admission (Kueue mode).
    """
    held_obj = workload if mode == "kueue" else trainjob
    hold = objects.hold_marks(held_obj, annotations)
    raw = hold.instance_text
    attempt = objects.attempt(trainjob, annotations)
    cause = kueue_cause(workload) if workload is not None else None
    suspended = objects.suspended(trainjob)
    opened_at = objects.opened_at(trainjob, annotations)
    common: dict[str, Any] = {
        "ref": ref,
        "hold_instance": hold.instance,
        "hold_instance_raw": raw,
        "hold_reason": hold.reason,
        "held_by": hold.by,
        "held_at": hold.at,
        "kueue_cause": cause,
        "attempt": attempt if attempt is not None else 0,
        "opened": opened_at is not None,
        "opened_at": opened_at,
        "ended_reason": objects.ended_reason(trainjob),
        "suspended": suspended,
        "workload": objects.name(workload) if workload else None,
        "admission_checks": objects.admission_check_states(workload) if workload else (),
    }
    if common["ended_reason"] is not None:
        return Observation(state=State.ENDED, **common)
    if held_obj is not None and raw is not None and objects.hold_field_set(held_obj, mode):
        return Observation(state=State.HELD, **common)
    if mode == "kueue" and workload is not None:
        if cause is not None:
            return Observation(state=State.DEACTIVATED_BY_KUEUE, **common)
        if not objects.active(workload):
            return Observation(state=State.DEACTIVATED_BY_OTHER, **common)
    if not suspended:
        return Observation(state=State.RUNNING, **common)
    if opened_at is None:
        return Observation(state=State.AT_START_GATE, **common)
    if mode == "plain":
        return Observation(state=State.DEACTIVATED_BY_OTHER, **common)
    return Observation(state=State.WAITING_FOR_ADMISSION, **common)


# States in which no execution should be running: every pod is a previous execution's.
_STOPPED_STATES = frozenset(
    {
        State.HELD,
        State.DEACTIVATED_BY_KUEUE,
        State.DEACTIVATED_BY_OTHER,
        State.AT_START_GATE,
        State.WAITING_FOR_ADMISSION,
    }
)
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def leftover_pods(state: State, pods: list[Obj]) -> tuple[str, ...]:
    """Names of the pods that belong to no current execution, given the observed state.

    ``pods`` are ``{"name", "deleting", "phase"}`` views of the TrainJob's pods. Stopped: all
    of them (the readmission gate waits for exactly these). Running: those being deleted,
    which are a previous execution still terminating beside the current one. Ended: those
    not finished. The result is sorted, so equal facts give equal observations.
    """
    if state in _STOPPED_STATES:
        chosen = pods
    elif state is State.RUNNING:
        chosen = [pod for pod in pods if pod.get("deleting")]
    else:
        chosen = [pod for pod in pods if pod.get("phase") not in _FINISHED_PHASES]
    return tuple(sorted(str(pod.get("name")) for pod in chosen))


def multikueue_capability(
    namespace: str, gate_controller: str, dispatching: list[tuple[str, bool]]
) -> Capability:
    """Preflight's ``multiKueue``: safe unless a queue dispatches through MultiKueue
    without the readmission gate. ``dispatching``: (queue, gated) for each LocalQueue of
    ``namespace`` whose ClusterQueue lists an AdmissionCheck of MultiKueue's.

    Invariant: supported only when every dispatching queue is gated: then the gate counts
    the held execution's pods on every worker cluster before MultiKueue may dispatch again.
    """
    if not dispatching:
        return Capability(True, f"no LocalQueue in {namespace} dispatches through MultiKueue")
    bare = [queue for queue, gated in dispatching if not gated]
    if bare:
        return Capability(
            False,
            f"{', '.join(bare)} dispatches to worker clusters through MultiKueue without an "
            f"AdmissionCheck of {gate_controller}: after a Release MultiKueue may dispatch the "
            "job to a worker again while the held execution still runs on the first (Kueue "
            "does not wait for its pods there); list the readmission AdmissionCheck beside "
            "MultiKueue's in the ClusterQueue "
            '(docs/explanation/readmission-gate.md, "MultiKueue")',
        )
    queues = ", ".join(queue for queue, _ in dispatching)
    return Capability(
        True,
        f"{queues} dispatches through MultiKueue and readmits only through "
        f"{gate_controller}, which counts the job's pods on every worker cluster",
    )


def needs_namespace_for_start(trainjob: object, *, manage_jobs_without_queue_name: bool) -> str:
    """The namespace whose labels Start must read before deciding, or "" when none.

    Only where Kueue manages jobs without a queue name, and only for a body without the
    queue-name label: whether Kueue manages it then depends on the namespace's labels
    (``kueue.managedJobsNamespaceSelector``). A malformed body gives "" (validation names
    the field)."""
    if not manage_jobs_without_queue_name or not isinstance(trainjob, dict):
        return ""
    meta = trainjob.get("metadata")
    if not isinstance(meta, dict) or objects.is_kueue_managed(trainjob):
        return ""
    namespace = meta.get("namespace")
    return namespace if isinstance(namespace, str) and _DNS_LABEL_RE.fullmatch(namespace) else ""


def validate_start_body(
    trainjob: object,
    *,
    mode: Mode,
    annotations: Annotations,
    kueue_manages_unlabelled: bool = False,
) -> Obj:
    """Check a TrainJob body for Start; return the body to create (a copy).

    Raises ValueError naming the offending field. The body must be a new TrainJob with
    ``metadata.namespace`` and ``metadata.name`` and ``spec.runtimeRef.name``; it must not
    carry the adapter's own annotations (hold keys, opened, attempt: only the adapter's calls
    write them). Kueue mode needs the ``kueue.x-k8s.io/queue-name`` label, unless Kueue
    manages TrainJobs without one in its namespace (``kueue_manages_unlabelled``: Kueue's
    manageJobsWithoutQueueName, and the namespace selected), and leaves ``spec.suspend`` as
    given (Kueue owns it). Plain mode refuses a TrainJob Kueue would manage (the label, or
    ``kueue_manages_unlabelled``: Kueue would own ``spec.suspend`` and admit it past the
    start gate), refuses ``spec.suspend: false`` and fills in ``true``: the TrainJob starts
    at its start gate and Open runs it.
    """
    if not isinstance(trainjob, dict):
        raise ValueError("trainjob: must be a mapping (a TrainJob body)")
    body: Obj = copy.deepcopy(trainjob)
    api_version = body.setdefault("apiVersion", TRAINJOB.api_version)
    if api_version != TRAINJOB.api_version:
        raise ValueError(f"apiVersion: must be {TRAINJOB.api_version!r}, got {api_version!r}")
    kind = body.setdefault("kind", TRAINJOB.kind)
    if kind != TRAINJOB.kind:
        raise ValueError(f"kind: must be {TRAINJOB.kind!r}, got {kind!r}")
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        raise ValueError("metadata: must be a mapping with namespace and name")
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or _DNS_LABEL_RE.fullmatch(namespace) is None:
        raise ValueError(f"metadata.namespace: must name the namespace, got {namespace!r}")
    name = meta.get("name")
    if not isinstance(name, str) or _RFC1035_RE.fullmatch(name) is None:
        raise ValueError(
            f"metadata.name: must be an RFC 1035 label of at most 63 chars, got {name!r}"
        )
    for key in ("resourceVersion", "uid"):
        if meta.get(key):
            raise ValueError(f"metadata.{key}: Start creates a new TrainJob; remove it")
    ann = meta.get("annotations") or {}
    if not isinstance(ann, dict):
        raise ValueError("metadata.annotations: must be a mapping")
    own = (*annotations.hold_keys, annotations.opened, annotations.attempt)
    for key in own:
        if key in ann:
            raise ValueError(
                f"metadata.annotations[{key}]: written only by the adapter's calls; remove it"
            )
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise ValueError("metadata.labels: must be a mapping")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise ValueError("spec: must be a mapping")
    runtime = spec.get("runtimeRef")
    if (
        not isinstance(runtime, dict)
        or not isinstance(runtime.get("name"), str)
        or not runtime["name"]
    ):
        raise ValueError("spec.runtimeRef.name: required (the training runtime to use)")
    suspend = spec.get("suspend")
    if suspend is not None and not isinstance(suspend, bool):
        raise ValueError(f"spec.suspend: must be a boolean, got {suspend!r}")
    if mode == "kueue":
        if not labels.get(QUEUE_NAME_LABEL) and not kueue_manages_unlabelled:
            raise ValueError(
                f"metadata.labels[{QUEUE_NAME_LABEL}]: required in Kueue mode (the LocalQueue),"
                f" unless Kueue manages jobs without a queue name in namespace {namespace}"
                " (kueue.manageJobsWithoutQueueName and kueue.managedJobsNamespaceSelector, set"
                " as Kueue is configured)"
            )
        return body
    if QUEUE_NAME_LABEL in labels:
        raise ValueError(
            f"metadata.labels[{QUEUE_NAME_LABEL}]: a Kueue-managed TrainJob cannot be started"
            " in plain mode (Kueue owns spec.suspend); configure mode: kueue"
        )
    if kueue_manages_unlabelled:
        raise ValueError(
            f"metadata.namespace: Kueue manages every TrainJob in namespace {namespace}, queue"
            " label or not (kueue.manageJobsWithoutQueueName, and kueue.managedJobsNamespace"
            "Selector selects it), so it would own spec.suspend and admit the job past its"
            " start gate; start it in a namespace Kueue does not manage, or configure"
            " mode: kueue"
        )
    if suspend is False:
        raise ValueError(
            "spec.suspend: must be true or absent in plain mode; the TrainJob waits at its"
            " start gate until Open"
        )
    spec["suspend"] = True
    return body
