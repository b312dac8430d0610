"""Typed accessors over TrainJob and Workload objects, and the writes of holdwarden's own
marks on them: one meaning for every field.

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

The writes are pure builders (``hold_annotations``, ``opened_annotation``,
``attempt_annotation``, ``annotated``, ``with_admission_check``): they return what to write
and never modify what was read. The adapter's decisions and the readmission gate write the
hold annotations, the opened mark and ``P/attempt`` only through them.

Hot path: the enforcer calls these for every review, so ``dict`` is tested first (objects
come from JSON); the ``Mapping`` ABC check costs about a microsecond a call.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import (
    JOB_UID_LABEL,
    MULTIKUEUE_CONTROLLER,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    Annotations,
    Mode,
    format_hold_instance,
    parse_hold_instance,
)

Obj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}
ENDED_CONDITIONS = ("Complete", "Failed")


def is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    return type(value) is dict or isinstance(value, Mapping)


# section and _metadata_map spell is_map out: the enforcer reads a review's objects through
# them some twenty times per review, and the extra call was a tenth of the rules' time.


def section(obj: object, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when both are mappings, else an empty mapping."""
    if type(obj) is not dict and not isinstance(obj, Mapping):
        return _EMPTY
    value = obj.get(key)
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def _metadata_map(obj: object, key: str) -> Mapping[str, Any]:
    value = section(obj, "metadata").get(key)
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


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


# ---- identity ----------------------------------------------------------------------------


def namespace(obj: object) -> str | None:
    value = section(obj, "metadata").get("namespace")
    return value if isinstance(value, str) else None


def uid(obj: object) -> str | None:
    """``metadata.uid``; None when absent or not text."""
    value = section(obj, "metadata").get("uid")
    return value if isinstance(value, str) else None


def resource_version(obj: object) -> str | None:
    value = section(obj, "metadata").get("resourceVersion")
    return value if isinstance(value, str) else None


def generation(obj: object) -> int | None:
    """``metadata.generation``; None when absent or not an integer (a bool is not one)."""
    value = section(obj, "metadata").get("generation")
    return value if type(value) is int else None


def same_identity(was: object, now: object) -> bool:
    """``now`` is the object ``was`` was: the same uid and the same ownerReferences (a
    Workload re-owned, or a TrainJob deleted and made again under its name, is not)."""
    before, after = section(was, "metadata"), section(now, "metadata")
    return after.get("uid") == before.get("uid") and after.get("ownerReferences") == before.get(
        "ownerReferences"
    )


def job_uid_selector(trainjob_uid: str) -> str:
    """The label selector of the Workloads Kueue made for the TrainJob with that uid (the
    label alone does not make a Workload the TrainJob's: ``controlled_by`` does)."""
    return f"{JOB_UID_LABEL}={trainjob_uid}"


# Kueue names the Workload of a job "<kind>-<job name>-<hash>" (jobframework's
# workload_names.go in v0.19.2): the prefix is cut to fit the name limit, and the hash is
# the first five hex digits of SHA-1 over kind, group, job name and uid, joined by line
# feeds. The limit is 253, or 63 with its ShortWorkloadNames feature gate (alpha, off by
# default), so both spellings are candidates.
_KUEUE_NAME_HASH_LENGTH = 5
_KUEUE_NAME_LIMITS = (253, 63)


def kueue_workload_names(trainjob_name: str, trainjob_uid: str) -> tuple[str, ...]:
    """The names Kueue gives the Workload of the TrainJob ``trainjob_name`` with uid
    ``trainjob_uid``, the default spelling first, without repeats.

    A prediction, not a fact: a reader GETs these names first because a GET by name costs
    the same at any cluster size, where a label-selected LIST makes the apiserver filter every
    Workload of the namespace. Whatever a GET returns must still pass ``controlled_by`` (a
    name alone does not make a Workload the TrainJob's), and a miss falls back to the LIST
    (another Kueue version, or workload slicing, may name it otherwise)."""
    text = "\n".join((TRAINJOB.kind, TRAINJOB.group, trainjob_name, trainjob_uid))
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
    suffix = digest[:_KUEUE_NAME_HASH_LENGTH]
    prefix = f"{TRAINJOB.kind.lower()}-{trainjob_name}"
    names: list[str] = []
    for limit in _KUEUE_NAME_LIMITS:
        name = f"{prefix[: limit - 1 - _KUEUE_NAME_HASH_LENGTH]}-{suffix}"
        if name not in names:
            names.append(name)
    return tuple(names)


# ---- hold and start-gate annotations ----------------------------------------------------


def hold_instance_text(obj: object, keys: Annotations | str) -> str | None:
    """The raw ``P/hold-instance`` value, None when absent; ``keys`` may be the key itself.

    "Carries a hold" means this is not None: a garbled hold is still a hold.
    """
    return annotation(obj, keys if isinstance(keys, str) else keys.hold_instance)


def hold_instance(obj: object, keys: Annotations | str) -> int | None:
    """The hold instance in force; None when absent or malformed."""
    return parse_hold_instance(hold_instance_text(obj, keys))


@dataclass(frozen=True)
class HoldMarks:
    """The hold annotations on a held object, as text (each None when absent)."""

    instance_text: str | None
    reason: str | None
    by: str | None
    at: str | None

    @property
    def instance(self) -> int | None:
        """The instance in force; None when absent or malformed."""
        return parse_hold_instance(self.instance_text)


def hold_marks(obj: object, keys: Annotations) -> HoldMarks:
    """All four hold annotations of ``obj`` (None: no object, all absent)."""
    return HoldMarks(
        instance_text=annotation(obj, keys.hold_instance),
        reason=annotation(obj, keys.hold_reason),
        by=annotation(obj, keys.held_by),
        at=annotation(obj, keys.held_at),
    )


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


def next_attempt(trainjob: object, keys: Annotations) -> int | None:
    """A + 1: the ``P/attempt`` a new execution is counted as; None when A is garbled."""
    current = attempt(trainjob, keys)
    return None if current is None else current + 1


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
    """The TrainJob carries Kueue's queue-name label (Kueue then owns ``spec.suspend``).

    Where Kueue manages jobs without a queue name, an unlabelled TrainJob can be Kueue's too:
    ``kueue_manages`` decides that, given its namespace's labels."""
    return QUEUE_NAME_LABEL in labels(trainjob)


def kueue_manages(
    trainjob: object,
    namespace_labels: Mapping[str, str],
    *,
    manage_jobs_without_queue_name: bool,
    namespace_selector: LabelSelector,
) -> bool:
    """Kueue, configured with these two settings, manages this TrainJob: it carries the
    queue-name label, or Kueue manages jobs without one and the TrainJob's namespace (with
    ``namespace_labels``) is one its ``managedJobsNamespaceSelector`` selects."""
    if is_kueue_managed(trainjob):
        return True
    return manage_jobs_without_queue_name and namespace_selector.matches(namespace_labels)


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


def _admission_check_list(workload: object) -> list[Any]:
    found = section(workload, "status").get("admissionChecks")
    return found if isinstance(found, list) else []


def admission_checks(workload: object) -> list[tuple[int, Mapping[str, Any]]]:
    """The Workload's ``status.admissionChecks`` entries that are objects, each with its
    index in the list (what ``with_admission_check`` takes), in order."""
    return [(i, c) for i, c in enumerate(_admission_check_list(workload)) if is_map(c)]


def admission_check_names(workload: object) -> list[str]:
    """The names of the Workload's AdmissionChecks, in order (entries without a text name
    are left out)."""
    return [str(c["name"]) for _, c in admission_checks(workload) if isinstance(c.get("name"), str)]


def admission_check(workload: object, names: Iterable[str]) -> tuple[int, Mapping[str, Any]] | None:
    """The first of the Workload's AdmissionChecks named in ``names``, with its index."""
    wanted = frozenset(names)
    for index, check in admission_checks(workload):
        if check.get("name") in wanted:
            return index, check
    return None


def admission_check_states(workload: object) -> tuple[tuple[str, str], ...]:
    """The Workload's ``status.admissionChecks`` as (name, state) pairs, sorted by name;
    entries without a text name are left out. Empty: Kueue applied no AdmissionCheck."""
    pairs = {
        str(c["name"]): _as_text(c.get("state"))
        for _, c in admission_checks(workload)
        if isinstance(c.get("name"), str) and c["name"]
    }
    return tuple(sorted(pairs.items()))


def cluster_queue_admission_checks(cluster_queue: object) -> list[str]:
    """The AdmissionCheck names a ClusterQueue applies (v1beta2 ``admissionChecksStrategy``,
    and v1beta1's ``admissionChecks`` list if an older served version answered), sorted."""
    spec = section(cluster_queue, "spec")
    listed = spec.get("admissionChecks")
    names = [str(name) for name in listed if name] if isinstance(listed, list) else []
    strategy = section(spec, "admissionChecksStrategy").get("admissionChecks")
    for entry in strategy if isinstance(strategy, list) else []:
        if is_map(entry) and entry.get("name"):
            names.append(str(entry["name"]))
    return sorted(set(names))


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


# ---- writes: pure builders of what to write ----------------------------------------------


def hold_annotations(
    keys: Annotations, *, instance: int, reason: str, holder: str, at: datetime
) -> dict[str, str]:
    """The four hold annotations Hold writes on the held object, in the same update as its
    hold field (Release removes all of them: ``keys.hold_keys``)."""
    return {
        keys.hold_instance: format_hold_instance(instance),
        keys.hold_reason: reason,
        keys.held_at: format_time(at),
        keys.held_by: holder,
    }


def opened_annotation(keys: Annotations, at: datetime) -> dict[str, str]:
    """The opened mark (``P/opened``) the first Open writes on the TrainJob."""
    return {keys.opened: format_time(at)}


def attempt_annotation(keys: Annotations, value: int) -> dict[str, str]:
    """``P/attempt`` = ``value`` (Open and Release raise A to ``next_attempt``; the gate to
    the attempt its Ready check granted)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"an attempt is an integer >= 0, got {value!r}")
    return {keys.attempt: str(value)}


def annotated(
    obj: Obj, put: Mapping[str, str] | None = None, remove: Iterable[str] = ()
) -> dict[str, Any]:
    """The object to write: ``obj`` with the annotations in ``remove`` taken away and those
    in ``put`` set, in new ``metadata``, ``metadata.annotations`` and ``spec`` dicts; every
    other part is shared with ``obj``, which is never modified.

    Why shallow: a write changes only annotations and top-level ``spec`` fields, and
    copying status and managedFields (most of an object) would be work done between the
    read and the write for nothing (``holdwarden.adapter.patches`` relies on the sharing too).
    """
    body = dict(obj)
    meta = body["metadata"] = dict(section(obj, "metadata"))
    found = meta.get("annotations")
    ann = meta["annotations"] = dict(found) if isinstance(found, dict) else {}
    for key in remove:
        ann.pop(key, None)
    if put:
        ann.update(put)
    if isinstance(body.get("spec"), dict):
        body["spec"] = dict(body["spec"])
    return body


def with_admission_check(
    workload: Obj,
    index: int,
    fields: Mapping[str, str],
    condition: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A deep copy of the Workload with ``fields`` set on ``status.admissionChecks[index]``
    and, with ``condition``, that status condition set in place of any of its type (what
    the readmission gate writes to the status subresource, in one update)."""
    updated = copy.deepcopy(dict(workload))
    status = updated["status"]
    status["admissionChecks"][index].update(fields)
    if condition is not None:
        others = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
        status["conditions"] = [*others, dict(condition)]
    return updated


def granted_condition(annotations: Annotations, attempt: int, now: str) -> dict[str, Any]:
    """The Workload condition that records attempt ``attempt`` as granted (``now``: RFC 3339)."""
    return {
        "type": annotations.attempt_granted,
        "status": "True",
        "reason": "Granted",
        "message": f"attempt {attempt} admitted by the readmission gate",
        "lastTransitionTime": now,
    }


_GRANTED_CONDITION_RE = re.compile(r"attempt ([0-9]+) admitted by the readmission gate")


def recorded_grant(workload: object, annotations: Annotations) -> int | None:
    """The attempt the gate last recorded as granted on this Workload (its condition), or
    None. Total: a missing, garbled or out-of-range record reads as None."""
    found = condition(workload, annotations.attempt_granted)
    message = found.get("message") if found is not None else None
    match = _GRANTED_CONDITION_RE.fullmatch(message) if isinstance(message, str) else None
    return parse_hold_instance(match.group(1)) if match else None


# ---- time --------------------------------------------------------------------------------


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC, second precision, as Kubernetes writes timestamps."""
    if moment.tzinfo is None:
        raise ValueError("time must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
