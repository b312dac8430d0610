"""The one definition of holdwarden's shared vocabulary.

Annotation keys, label keys, resource coordinates, rule ids and the parsing of a hold
instance live here and nowhere else. The adapter, the enforcer and the CLI import them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

DEFAULT_ANNOTATION_PREFIX = "holdwarden.io"

# Kueue mode: the hold is the Workload's spec.active=false; plain mode: the TrainJob's
# spec.suspend=true (the configuration's ``mode``).
Mode = Literal["kueue", "plain"]

# Labels written by other projects; holdwarden only reads them.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

DEFAULT_KUEUE_IDENTITIES: tuple[str, ...] = (
    "system:serviceaccount:kueue-system:kueue-controller-manager",
)


@dataclass(frozen=True)
class Resource:
    """Coordinates of a custom resource, as the API server and AdmissionReview name it."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


TRAINJOB = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
WORKLOAD = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
# Read only, by preflight: which queues a namespace's jobs go through, and whether their
# ClusterQueue runs the readmission gate; which runtimes a probe TrainJob can name.
LOCALQUEUE = Resource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTERQUEUE = Resource("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue")
ADMISSIONCHECK = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", "AdmissionCheck")
TRAININGRUNTIME = Resource(
    "trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime"
)
CLUSTERTRAININGRUNTIME = Resource(
    "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime"
)


@dataclass(frozen=True)
class Annotations:
    """The annotation keys under one prefix (``annotationPrefix`` in the configuration).

    The four hold keys go on the held object together and are removed together.
    """

    prefix: str = DEFAULT_ANNOTATION_PREFIX

    @property
    def hold_instance(self) -> str:
        return f"{self.prefix}/hold-instance"

    @property
    def hold_reason(self) -> str:
        return f"{self.prefix}/hold-reason"

    @property
    def held_at(self) -> str:
        return f"{self.prefix}/held-at"

    @property
    def held_by(self) -> str:
        return f"{self.prefix}/held-by"

    @property
    def opened(self) -> str:
        return f"{self.prefix}/opened"

    @property
    def attempt(self) -> str:
        return f"{self.prefix}/attempt"

    @property
    def hold_keys(self) -> tuple[str, str, str, str]:
        """Every key a Hold writes and a Release removes."""
        return (self.hold_instance, self.hold_reason, self.held_at, self.held_by)


class RuleId(StrEnum):
    """The enforcer's rules, by the ids the design contract publishes."""

    HELD_TRAINJOB_SUSPENDED = "held-trainjob-suspended"
    HELD_WORKLOAD_INACTIVE = "held-workload-inactive"
    KUEUE_OWNS_SUSPEND = "kueue-owns-suspend"
    HOLD_INSTANCE_MONOTONIC = "hold-instance-monotonic"
    HOLD_INSTANCE_MALFORMED = "hold-instance-malformed"


# Kueue's Evicted condition reason for its own deactivations is "DeactivatedDueTo<Cause>";
# exactly "Deactivated" means someone set spec.active=false by hand or by script.
KUEUE_DEACTIVATED_DUE_TO_PREFIX = "DeactivatedDueTo"
DEACTIVATED_REASON = "Deactivated"
DEACTIVATION_TARGET_CONDITION = "DeactivationTarget"
EVICTED_CONDITION = "Evicted"

# A hold instance is written in canonical decimal: no sign, no leading zero, no spaces.
# Anything else is garbled, so "01" and "1" can never be two spellings of one instance.
_INSTANCE_RE = re.compile(r"[1-9][0-9]{0,18}")


def parse_hold_instance(value: object) -> int | None:
    """Return the instance a ``hold-instance`` annotation value names, or None if malformed.

    Invariant: the result is an int >= 1 whose canonical decimal spelling equals ``value``.
    """
    if not isinstance(value, str) or _INSTANCE_RE.fullmatch(value) is None:
        return None
    return int(value)


def format_hold_instance(instance: int) -> str:
    """The canonical annotation value for an instance (>= 1)."""
    if isinstance(instance, bool) or not isinstance(instance, int) or instance < 1:
        raise ValueError(f"hold instance must be an integer >= 1, got {instance!r}")
    return str(instance)
