"""The one definition of holdwarden's shared vocabulary.

Annotation keys, label keys, resource coordinates, rule ids and the parsing of a hold
instance live here and nowhere else. The adapter, the enforcer and the CLI import them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeGuard

DEFAULT_ANNOTATION_PREFIX = "holdwarden.io"

# Kueue mode: the hold is the Workload's spec.active=false; plain mode: the TrainJob's
# spec.suspend=true (the configuration's ``mode``).
Mode = Literal["kueue", "plain"]

# Labels written by other projects; holdwarden only reads them.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

# Where Kueue manages jobs without a queue name (its manageJobsWithoutQueueName), the
# enforcer's second webhook entry: its namespaceSelector is Kueue's
# managedJobsNamespaceSelector, so the apiserver itself decides which namespaces it covers,
# and the enforcer judges what arrives on this path with every TrainJob counted as Kueue's.
KUEUE_NAMESPACE_WEBHOOK = "kueue-managed-namespaces.holdwarden.io"
KUEUE_NAMESPACE_PATH = "/validate/kueue-managed-namespace"

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
# Read only, by preflight: whether MultiKueue is in use here at all (issue 29, trap 3).
MULTIKUEUECONFIG = Resource("kueue.x-k8s.io", "v1beta2", "multikueueconfigs", "MultiKueueConfig")
# Read only, by preflight: the TrainJob CRD, whose schema tells a Trainer that honours
# spec.managedBy (v2.3 and later) from one that ignores it (v2.2 and earlier).
CRD = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition"
)
TRAINJOB_CRD_NAME = f"{TRAINJOB.plural}.{TRAINJOB.group}"
# Read only, by the readmission gate on a MultiKueue manager cluster: the worker clusters
# MultiKueue may have dispatched a job to, and (through their kubeconfig Secrets) the
# pods it runs there.
MULTIKUEUECLUSTER = Resource("kueue.x-k8s.io", "v1beta2", "multikueueclusters", "MultiKueueCluster")

# MultiKueue's name, in two places: an AdmissionCheck's spec.controllerName, and the
# spec.managedBy that Kueue's webhook gives a TrainJob it dispatches to worker clusters
# (Trainer then creates nothing for it on the manager; its pods run from a mirror copy
# of the same name and namespace on one worker).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
# The key of a MultiKueueCluster's kubeconfig Secret (in Kueue's namespace) that holds it.
MULTIKUEUE_KUBECONFIG_KEY = "kubeconfig"

# On the ValidatingWebhookConfiguration: the failurePolicy its webhooks are to have once
# the leader has verified the enforcer answers (certs/enforcing.py). The manifests ship
# Ignore plus this annotation, so a fresh install never refuses writes to an enforcer that
# is not serving yet. Not under the configurable annotation prefix: it names a setting of
# holdwarden's own install, not a mark on a user's object.
FAILURE_POLICY_ANNOTATION = "holdwarden.io/failure-policy"


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
    def attempt_granted(self) -> str:
        """The Workload status condition type in which the readmission gate records the
        attempt it granted (not an annotation: it is written with the Ready check, in the
        same status update, and Kueue's reset of the checks on eviction leaves it)."""
        return f"{self.prefix}/AttemptGranted"

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
    # Optional: on only when ``webhook.holderIdentities`` is set (policy: its own object).
    HOLD_OWNER_ONLY = "hold-owner-only"
    # DELETE of a held Workload: Kueue would make a fresh, active one and run the job.
    HELD_WORKLOAD_KEPT = "held-workload-kept"


def event_reason(rule: str | None) -> str:
    """The UpperCamelCase Event reason of a rule id (Kubernetes' convention for reasons):
    ``held-trainjob-suspended`` is ``HeldTrainjobSuspended``; no rule is ``Refused``."""
    if not rule:
        return "Refused"
    return "".join(part[:1].upper() + part[1:] for part in str(rule).split("-") if part)


def rule_of_event_reason(reason: object) -> str | None:
    """The rule id an Event reason of ours stands for (``event_reason`` undone), for the
    rules this build knows; an older Event's reason (the rule id itself) as it is."""
    if not isinstance(reason, str):
        return None
    for rule in RuleId:
        if reason in (event_reason(rule), str(rule)):
            return str(rule)
    return None if reason == "Refused" else reason


# hold-owner-only's break-glass: members of this group may always change a hold. It is the
# apiserver's own superuser group (RBAC cannot restrict it), so exempting it gives a cluster
# admin nothing they could not do anyway (delete the webhook or the policy), but lets them
# fix a wedged hold without doing that (docs/explanation/policy.md, "Break-glass").
BREAK_GLASS_GROUP = "system:masters"

# Who may delete a held Workload (held-workload-kept): the garbage collector, once its
# TrainJob is gone, and the namespace controller, once its namespace is. With
# --use-service-account-credentials each kube-controller-manager controller has its own
# service account; without it they all act as system:kube-controller-manager.
DEFAULT_WORKLOAD_DELETERS: tuple[str, ...] = (
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
)


# Kueue's Evicted condition reason for its own deactivations is "DeactivatedDueTo<Cause>";
# exactly "Deactivated" means someone set spec.active=false by hand or by script.
KUEUE_DEACTIVATED_DUE_TO_PREFIX = "DeactivatedDueTo"
DEACTIVATED_REASON = "Deactivated"
DEACTIVATION_TARGET_CONDITION = "DeactivationTarget"
EVICTED_CONDITION = "Evicted"
# Kueue sets Requeued=False with the Evicted condition's reason when it evicts. Kueue up
# to v0.19 turns it True again on reactivation only when that reason is exactly
# "Deactivated"; after its own deactivation ("DeactivatedDueTo<Cause>") it stays False, and
# a False Requeued keeps the Workload out of its queue for good (kueue issue 14870, fixed
# in v0.20): a job released after Kueue's own deactivation never runs again.
REQUEUED_CONDITION = "Requeued"

# Kueue's FailureRecoveryPolicy (alpha feature gate): a pod carrying this annotation with
# value "true", Terminating on an unreachable node for a minute, is force-deleted by
# Kueue, though the lost node may still run it.
SAFE_TO_FORCEFULLY_DELETE_ANNOTATION = "kueue.x-k8s.io/safe-to-forcefully-delete"
FAILURE_RECOVERY_FEATURE_GATE = "FailureRecoveryPolicy"
# Where Kueue's own configuration lives in a default install (in Kueue's namespace).
KUEUE_CONFIG_MAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"

# A hold instance is an integer in [1, MAX_HOLD_INSTANCE]: Kubernetes' int64, so any
# program that stores or compares it as a 64-bit integer (Go, CEL, a database column) agrees
# with us (design.md, "hold-instance-malformed"). The adapter refuses a larger one before
# any request (Invalid), the enforcer refuses it as malformed, and every reader parses it as
# no instance. Without the bound, 10**19 was written by Hold and then never matched by
# Release's parser ("instance '10000000000000000000' is in force, not 10000000000000000000").
MAX_HOLD_INSTANCE = 2**63 - 1

# It is written in canonical decimal: no sign, no leading zero, no spaces. Anything else is
# garbled, so "01" and "1" can never be two spellings of one instance. 19 digits is the
# length of MAX_HOLD_INSTANCE; the value check below does the rest.
_INSTANCE_RE = re.compile(r"[1-9][0-9]{0,18}")


def is_hold_instance(value: object) -> TypeGuard[int]:
    """True for an ``int`` (not a ``bool``) in [1, MAX_HOLD_INSTANCE]: the one bound."""
    return (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_HOLD_INSTANCE
    )


def check_hold_instance(value: object) -> int:
    """Return ``value`` if it is a hold instance; raise ValueError saying the bound if not.

    The adapter and the CLI call this once, at the boundary, before any request is sent.
    """
    if not is_hold_instance(value):
        raise ValueError(
            f"hold instance must be an integer >= 1 and <= 2^63-1 ({MAX_HOLD_INSTANCE}),"
            f" got {value!r}"
        )
    return value


def parse_hold_instance(value: object) -> int | None:
    """Return the instance a ``hold-instance`` annotation value names, or None if malformed.

    Invariant: the result is an int in [1, MAX_HOLD_INSTANCE] whose canonical decimal
    spelling equals ``value``; "9223372036854775808" (2^63) and longer are malformed.
    """
    if not isinstance(value, str) or _INSTANCE_RE.fullmatch(value) is None:
        return None
    number = int(value)
    return number if number <= MAX_HOLD_INSTANCE else None


def format_hold_instance(instance: int) -> str:
    """The canonical annotation value for an instance in [1, MAX_HOLD_INSTANCE]."""
    return str(check_hold_instance(instance))
