"""The adapter's value types: what a caller passes in and what Observe and Preflight return.

Every type here is an immutable value; none of them does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

# A TrainJob name is an RFC 1035 label (the TrainJob CRD's own CEL rule); a namespace
# is an RFC 1123 label.
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, order=True)
class Ref:
    """Names one TrainJob: its namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Ref:
        """Parse ``NAMESPACE/NAME``; raise ValueError saying what is expected."""
        namespace, sep, name = text.partition("/")
        if (
            not sep
            or _NAMESPACE_RE.fullmatch(namespace) is None
            or _NAME_RE.fullmatch(name) is None
        ):
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME, e.g. 'team-a/llm-finetune'")
        return cls(namespace, name)


@dataclass(frozen=True)
class CallMeta:
    """What every hold-family call carries.

    ``deadline`` must be timezone-aware; the adapter sends no request after it. ``None`` or a
    naive datetime makes the call ``Invalid``. ``instance`` (1 <= n <= 2^63-1) names the hold
    instance; Hold and Release need it, Open and Start ignore it.
    """

    deadline: datetime | None
    instance: int | None = None


class State(StrEnum):
    """What Observe found, from the point of view of "may this object run?"."""

    HELD = "held"
    """A hold placed by the adapter is in force (hold annotations on the held object)."""
    DEACTIVATED_BY_KUEUE = "deactivated-by-kueue"
    """Kueue deactivated the Workload for its own reason (``kueue_cause``)."""
    DEACTIVATED_BY_OTHER = "deactivated-by-other"
    """Stopped by someone else: Workload inactive (Kueue mode) or TrainJob suspended after
    it was opened (plain mode), with no hold annotation."""
    AT_START_GATE = "at-start-gate"
    """Never opened: waiting for Open."""
    RUNNING = "running"
    """Opened and not suspended."""
    WAITING_FOR_ADMISSION = "waiting-for-admission"
    """Kueue mode: opened, Workload active, TrainJob still suspended (not admitted yet)."""
    ENDED = "ended"
    """Condition ``Complete`` or ``Failed`` is True (``ended_reason`` says which)."""


@dataclass(frozen=True)
class Observation:
    """One Observe: the state plus the hold, Kueue and start-gate facts it was decided on.

    Invariant: ``state is State.HELD`` only when a hold-instance annotation is present on the
    held object and the hold field is set (Workload ``spec.active=false`` / TrainJob
    ``spec.suspend=true``). A deactivation without the annotation is never HELD.
    """

    ref: Ref
    state: State
    hold_instance: int | None = None
    hold_instance_raw: str | None = None
    """The annotation's text; differs from ``hold_instance`` only when it is malformed."""
    hold_reason: str | None = None
    held_by: str | None = None
    held_at: str | None = None
    kueue_cause: str | None = None
    """Kueue's cause, e.g. ``MaximumExecutionTimeExceeded`` (from ``DeactivatedDueTo<Cause>``)."""
    attempt: int = 0
    """P/attempt ("A": executions started); 0 when absent."""
    opened: bool = False
    opened_at: str | None = None
    ended_reason: str | None = None
    """``Complete`` or ``Failed`` when ended."""
    suspended: bool | None = None
    """The TrainJob's spec.suspend as read."""
    workload: str | None = None
    """Kueue mode: the Workload's name, or None when it has none yet."""
    leftover_pods: tuple[str, ...] = ()
    """Pods that belong to no current execution: every pod while the job is stopped
    (held, deactivated, suspended), pods being deleted while it runs (a previous execution
    still terminating), pods not finished after it ended. Sorted names."""
    pods_error: str | None = None
    """Why the pods could not be listed (then ``leftover_pods`` says nothing)."""
    admission_checks: tuple[tuple[str, str], ...] = ()
    """Kueue mode: the Workload's AdmissionChecks and their states (``status.admissionChecks``,
    sorted by name). A job running with none was admitted past the readmission gate: Kueue
    applies a flavor-scoped check only to a Workload assigned a flavor, and one whose pods
    request no resources gets none (``ungated_admission``)."""

    kueue_requeue_blocked: str | None = None
    """Kueue mode: the reason of the Workload's ``Requeued`` condition when it is False
    with ``DeactivatedDueTo<Cause>`` (Kueue's own deactivation). Kueue up to v0.19 never
    turns such a condition True on reactivation, and a False ``Requeued`` keeps the
    Workload out of its queue: once active again it is ``stranded`` (kueue issue 14870)."""
    workload_active: bool = True
    """Kueue mode: the Workload's ``spec.active`` as read (absent: true)."""

    @property
    def stranded(self) -> bool:
        """Kueue mode: Kueue deactivated the Workload itself (``kueue_requeue_blocked``),
        no hold is in force and the job is not running, and reactivating it, by Release or
        by hand, will not run it on Kueue up to v0.19: Kueue either deactivates it again at
        once (its ``DeactivationTarget`` condition stays True after a time limit) or, active,
        never queues it (kueue issue 14870). Deleting the Workload does (docs/explanation/traps.md,
        1). On Kueue v0.20 and later a reactivated one is requeued within moments."""
        return (
            self.workload is not None
            and self.kueue_requeue_blocked is not None
            and self.state not in (State.HELD, State.ENDED, State.RUNNING)
        )

    @property
    def ungated_admission(self) -> bool:
        """Kueue mode: the job runs, and its Workload carries no AdmissionCheck at all, so
        the readmission gate did not decide this execution (docs/reference/adapter-api.md,
        "Observe")."""
        return (
            self.workload is not None
            and self.state is State.RUNNING
            and not (self.admission_checks)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": str(self.ref),
            "state": self.state.value,
            "holdInstance": self.hold_instance,
            "holdInstanceRaw": self.hold_instance_raw,
            "holdReason": self.hold_reason,
            "heldBy": self.held_by,
            "heldAt": self.held_at,
            "kueueCause": self.kueue_cause,
            "attempt": self.attempt,
            "opened": self.opened,
            "openedAt": self.opened_at,
            "endedReason": self.ended_reason,
            "suspended": self.suspended,
            "workload": self.workload,
            "leftoverPods": list(self.leftover_pods),
            "podsError": self.pods_error,
            "admissionChecks": dict(self.admission_checks),
            "ungatedAdmission": self.ungated_admission,
            "kueueRequeueBlocked": self.kueue_requeue_blocked,
            "workloadActive": self.workload_active,
            "stranded": self.stranded,
        }


@dataclass(frozen=True)
class ReleaseResult:
    """What a Release that succeeded found while it lifted the hold.

    Release used to return None; it returns this now, so a caller that ignores the result
    is unaffected. ``warnings`` are what the caller must act on although the hold was
    lifted (each names the object and what to do). ``kueue_requeue_blocked``: Kueue mode,
    the Workload was deactivated by Kueue itself (``DeactivatedDueTo<Cause>``) before or
    under the hold, and Kueue up to v0.19 will not queue it again after this reactivation
    (kueue issue 14870): the job stays stopped until someone acts (``warnings`` says how).
    """

    ref: Ref
    instance: int
    kueue_requeue_blocked: str | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": str(self.ref),
            "instance": self.instance,
            "kueueRequeueBlocked": self.kueue_requeue_blocked,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Capability:
    """One probed capability: supported or not, and why."""

    supported: bool
    reason: str


@dataclass(frozen=True)
class PreflightResult:
    """What the adapter can do here.

    ``hold_supported`` follows the spec word for word: Hold is unsupported when the hold
    round trip failed or, in Kueue mode, the adapter may not update Workloads. The other
    capabilities are reported for the operator and do not switch Hold off.
    """

    mode: str
    namespace: str
    hold_round_trip: Capability
    update_workloads: Capability
    update_trainjobs: Capability
    list_pods: Capability
    enforcer_installed: Capability
    extra: dict[str, Capability] = field(default_factory=dict)
    trainer_managed_by: Capability | None = None
    """Kueue mode, full preflight: unsupported when MultiKueue is in use here and the
    installed Trainer ignores ``spec.managedBy`` (v2.2 and earlier): a held and released
    job would run on this cluster AND on a worker. A condition of Hold (issue 29)."""

    @property
    def hold_supported(self) -> bool:
        return self.hold_unsupported_reason is None

    @property
    def hold_unsupported_reason(self) -> str | None:
        if not self.hold_round_trip.supported:
            return f"hold round trip failed: {self.hold_round_trip.reason}"
        if self.mode == "kueue" and not self.update_workloads.supported:
            return f"may not update Workloads: {self.update_workloads.reason}"
        if self.trainer_managed_by is not None and not self.trainer_managed_by.supported:
            return self.trainer_managed_by.reason
        return None

    def capabilities(self) -> dict[str, Capability]:
        return {
            "holdRoundTrip": self.hold_round_trip,
            "updateWorkloads": self.update_workloads,
            "updateTrainJobs": self.update_trainjobs,
            "listPods": self.list_pods,
            "enforcerInstalled": self.enforcer_installed,
            **({"trainerManagedBy": self.trainer_managed_by} if self.trainer_managed_by else {}),
            **self.extra,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "namespace": self.namespace,
            "holdSupported": self.hold_supported,
            "holdUnsupportedReason": self.hold_unsupported_reason,
            "capabilities": {
                k: {"supported": c.supported, "reason": c.reason}
                for k, c in self.capabilities().items()
            },
        }
