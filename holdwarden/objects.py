"""Typed accessors over TrainJob and Workload objects: one meaning for every field.

The adapter (``adapter/decisions.py``), the enforcer (``webhook/rules.py``) and the
readmission gate (``readmission/decisions.py``) read the same fields of the same objects. They
all read them here, so a field cannot mean one thing to the adapter and another to the gate
(Kueue's ``pkg/workload`` plays the same part for every Kueue controller).

Every accessor is total: it takes any JSON value where an object is expected (the enforcer
judges whatever a client sent) and never raises. The meanings, once:

- an annotation or label is a string; a non-string value (impossible through the apiserver,
  possible in a forged review) is spelled with its type, so it never parses as a number;
- ``spec.suspend`` (TrainJob) is true only when it is literally ``true``; absent is false;
- ``spec.active`` (Workload) is false only when it is literally ``false``; absent is true;
- a TrainJob has ended when its ``Complete`` or ``Failed`` condition is ``True``;
- ``P/hold-instance`` and ``P/attempt`` are canonical decimals (``vocabulary``); a garbled
  ``P/attempt`` is ``None`` to everyone, and nobody runs an object whose count is unknown;
- a Workload belongs to the TrainJob named by its *controller* ownerReference of kind
  TrainJob (Kueue writes exactly one), matched by uid where a uid is known.

Hot path: the enforcer calls these for every review, so ``dict`` is tested first (objects
come from JSON); the ``Mapping`` ABC check costs about a microsecond a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from holdwarden.vocabulary import (
    MULTIKUEUE_CONTROLLER,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    Annotations,
    Mode,
    parse_hold_instance,
)

Obj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}
ENDED_CONDITIONS = ("Complete", "Failed")


def is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)


def section(obj: object, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when both are mappings, else an empty mapping."""
    if not is_map(obj):
        return _EMPTY
    value = obj.get(key)
    return value if is_map(value) else _EMPTY


def _metadata_map(obj: object, key: str) -> Mapping[str, Any]:
    value = section(obj, "metadata").get(key)
    return value if is_map(value) else _EMPTY


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else f"{value!r} ({type(value).__name__})"


def annotation(obj: object, key: str) -> str | None:
    """One annotation's value, None when absent (non-strings spelled with their type)."""
    value = _metadata_map(obj, "annotations").get(key)
    return None if value is None else _as_text(value)


def annotations_of(obj: object) -> dict[str, str]:
    """All annotations as text (a copy)."""
    return {str(k): _as_text(v) for k, v in _metadata_map(obj, "annotations").items()}


def labels(obj: object) -> Mapping[str, Any]:
    return _metadata_map(obj, "labels")


def name(obj: object) -> str | None:
    value = section(obj, "metadata").get("name")
    return value if isinstance(value, str) else None


def is_deleting(obj: object) -> bool:
    """``metadata.deletionTimestamp`` is set: the object is going away."""
    return bool(section(obj, "metadata").get("deletionTimestamp"))


# ---- hold and start-gate annotations ----------------------------------------------------


def hold_instance_text(obj: object, keys: Annotations | str) -> str | None:
    """The raw ``P/hold-instance`` value, None when absent; ``keys`` may be the key itself.

    "Carries a hold" means this is not None: a garbled hold is still a hold.
    """
    return annotation(obj, keys if isinstance(keys, str) else keys.hold_instance)


def hold_instance(obj: object, keys: Annotations | str) -> int | None:
    """The hold instance in force; None when absent or malformed."""
    return parse_hold_instance(hold_instance_text(obj, keys))


def opened_at(trainjob: object, keys: Annotations) -> str | None:
    """``P/opened`` (the first Open's time), None when never opened (or empty)."""
    return annotation(trainjob, keys.opened) or None


def attempt_text(trainjob: object, keys: Annotations) -> str | None:
    return annotation(trainjob, keys.attempt)


def attempt(trainjob: object, keys: Annotations) -> int | None:
    """``P/attempt`` (A, executions started): absent is 0; garbled is None.

    None makes the adapter refuse to unsuspend and the gate refuse to admit, alike: an
    execution count nobody can read must be fixed by hand before anything runs again.
    """
    return parse_attempt(attempt_text(trainjob, keys))


def parse_attempt(value: str | None) -> int | None:
    """P/attempt text as an int (absent = 0); None when it is not a canonical decimal."""
    if value is None:
        return 0
    if value == "0":
        return 0
    return parse_hold_instance(value)


# ---- spec fields -------------------------------------------------------------------------


def suspended(trainjob: object) -> bool:
    """TrainJob ``spec.suspend``: true only when literally true (absent means false)."""
    return section(trainjob, "spec").get("suspend") is True


def active(workload: object) -> bool:
    """Workload ``spec.active``: false only when literally false (absent means true)."""
    return section(workload, "spec").get("active") is not False


def hold_field_set(obj: object, mode: Mode) -> bool:
    """The held object's hold field is in the held position (Workload inactive in Kueue
    mode, TrainJob suspended in plain mode)."""
    return not active(obj) if mode == "kueue" else suspended(obj)


def is_kueue_managed(trainjob: object) -> bool:
    """The TrainJob carries Kueue's queue-name label (Kueue then owns ``spec.suspend``)."""
    return QUEUE_NAME_LABEL in labels(trainjob)


def dispatched_by_multikueue(trainjob: object) -> bool:
    """The TrainJob's ``spec.managedBy`` is MultiKueue's: its pods never run in this
    cluster but from a mirror copy on a worker cluster (Kueue's TrainJob MultiKueue
    adapter dispatches only such a TrainJob)."""
    return section(trainjob, "spec").get("managedBy") == MULTIKUEUE_CONTROLLER


# ---- status conditions -------------------------------------------------------------------


def conditions(obj: object) -> list[Mapping[str, Any]]:
    found = section(obj, "status").get("conditions")
    return [c for c in found if is_map(c)] if isinstance(found, list) else []


def condition(obj: object, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions(obj):
        if cond.get("type") == type_:
            return cond
    return None


def condition_true(obj: object, type_: str) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def admission_check_states(workload: object) -> tuple[tuple[str, str], ...]:
    """The Workload's ``status.admissionChecks`` as (name, state) pairs, sorted by name;
    entries without a text name are left out. Empty: Kueue applied no AdmissionCheck."""
    found = section(workload, "status").get("admissionChecks")
    entries = [c for c in found if is_map(c)] if isinstance(found, list) else []
    pairs = {
        str(c["name"]): _as_text(c.get("state"))
        for c in entries
        if isinstance(c.get("name"), str) and c["name"]
    }
    return tuple(sorted(pairs.items()))


def ended_reason(trainjob: object) -> str | None:
    """``Complete`` or ``Failed`` when any condition of that type is True; None while not
    ended.

    Any, not the first: the API server keeps one condition per type for the real CRD, but
    an object as read may still carry several (a writer that does not merge by type), and
    "has it ended?" must err towards yes, since a Release of an ended job never runs it."""
    for type_ in ENDED_CONDITIONS:
        if any(c.get("type") == type_ and c.get("status") == "True" for c in conditions(trainjob)):
            return type_
    return None


# ---- ownership ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerRef:
    """A controller ownerReference: the owner's name and uid (uid may be empty)."""

    name: str
    uid: str


def controller_trainjob(workload: object) -> OwnerRef | None:
    """The TrainJob that controls a Workload: its controller ownerReference of that kind."""
    refs = section(workload, "metadata").get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if (
            is_map(ref)
            and ref.get("controller") is True
            and ref.get("kind") == TRAINJOB.kind
            and isinstance(ref.get("name"), str)
        ):
            uid = ref.get("uid")
            return OwnerRef(str(ref["name"]), uid if isinstance(uid, str) else "")
    return None


def controlled_by(workload: object, uid: str) -> bool:
    """The Workload's controller TrainJob is the one with ``uid``."""
    owner = controller_trainjob(workload)
    return owner is not None and owner.uid == uid


# ---- time --------------------------------------------------------------------------------


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, second precision, as Kubernetes writes timestamps."""
    if moment.tzinfo is None:
        raise ValueError("time must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
