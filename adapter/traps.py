"""The traps of Kueue and Trainer that a hold can fall into, decided purely (issue 29).

No I/O here: each function takes what was read (objects as the API server sent them, the text of a
ConfigMap, a refusal's status and message) and says what it means. Preflight
(``holdwarden.adapter.preflight``) and the operations (``holdwarden.adapter.operations``:
Observe, Release, every write of a TrainJob) ask the questions; these answer them.
docs/explanation/traps.md tells the story.

1. Kueue up to v0.19 does not requeue a Workload reactivated after Kueue's *own*
   deactivation: it turns the ``Requeued`` condition True again only when its reason is
   exactly ``Deactivated`` (kueue issue 14870, fixed in v0.20). A job Kueue stopped for a
   time or requeuing limit, then held and released, is active and never queued.
   (``requeue_blocked``, ``stranded_advice``.)
2. Trainer v2.3's webhook reads the TrainJob's runtime on every UPDATE, and v2.3 dropped
   the runtime finalizers: delete the runtime and every later write of the TrainJob is
   refused (Release, the gate's attempt raise, Kueue's unsuspend).
   (``runtime_of``, ``is_runtime_refusal``, ``runtime_missing_message``,
   ``runtimes_capability``.)
3. Trainer up to v2.2 ignores ``spec.managedBy``: on a MultiKueue manager a TrainJob
   dispatched to a worker also runs locally. (``trainer_honours_managed_by``,
   ``managed_by_capability``.)
4. Kueue's FailureRecoveryPolicy force-deletes annotated pods on an unreachable node (the
   gate then counts them gone), and ``objectRetentionPolicies.workloads.
   afterDeactivatedByKueue`` deletes a job Kueue deactivated, held or not.
   (``kueue_settings``, ``force_delete_capability``, ``retention_capability``.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from holdwarden import objects
from holdwarden.adapter.types import Capability
from holdwarden.vocabulary import (
    CLUSTERTRAININGRUNTIME,
    DEACTIVATION_TARGET_CONDITION,
    EVICTED_CONDITION,
    FAILURE_RECOVERY_FEATURE_GATE,
    KUEUE_CONFIG_KEY,
    KUEUE_CONFIG_MAP,
    KUEUE_DEACTIVATED_DUE_TO_PREFIX,
    MULTIKUEUE_CONTROLLER,
    REQUEUED_CONDITION,
    SAFE_TO_FORCEFULLY_DELETE_ANNOTATION,
    TRAININGRUNTIME,
    TRAINJOB,
    Resource,
)

QUOTA_RESERVED_CONDITION = "QuotaReserved"

# ---- 1. reactivation after Kueue's own deactivation ------------------------------------


def _kueue_reason(cond: Mapping[str, Any] | None, status: str) -> str | None:
    """The condition's reason when it has ``status`` and is ``DeactivatedDueTo<Cause>``."""
    if cond is None or cond.get("status") != status:
        return None
    reason = cond.get("reason")
    if (
        isinstance(reason, str)
        and reason.startswith(KUEUE_DEACTIVATED_DUE_TO_PREFIX)
        and len(reason) > len(KUEUE_DEACTIVATED_DUE_TO_PREFIX)
    ):
        return reason
    return None


def requeue_blocked(workload: object) -> str | None:
    """The ``DeactivatedDueTo<Cause>`` reason that keeps this Workload out of its queue once
    it is active, on Kueue up to v0.19; None when nothing does.

    What Kueue v0.19.2 does (its workload controller and jobframework reconciler): its own
    deactivation evicts with reason ``DeactivatedDueTo<Cause>``; when the job has stopped
    and the quota reservation is cleared, ``Requeued`` becomes False with that same reason;
    on reactivation only a ``Requeued`` reason of exactly ``Deactivated`` is turned True
    again, and the queue refuses any Workload whose ``Requeued`` is False. ``Evicted``
    stays True until the next quota reservation, and a hold on top of Kueue's deactivation
    does not evict again, so the reason survives a Hold.

    So it is blocked when ``Requeued`` is False with such a reason, or when it soon will
    be: evicted (or being deactivated, ``DeactivationTarget``) by Kueue while the quota is
    still reserved, before the reservation is cleared.
    """
    reserved = objects.condition_true(workload, QUOTA_RESERVED_CONDITION)
    if reserved:
        evicted = _kueue_reason(objects.condition(workload, EVICTED_CONDITION), "True")
        if evicted is not None:
            return evicted
        target = objects.condition(workload, DEACTIVATION_TARGET_CONDITION)
        if target is not None and target.get("status") == "True":
            cause = target.get("reason")
            if isinstance(cause, str) and cause:
                return f"{KUEUE_DEACTIVATED_DUE_TO_PREFIX}{cause}"
    return _kueue_reason(objects.condition(workload, REQUEUED_CONDITION), "False")


def stranded_advice(namespace: str, workload: str, reason: str) -> str:
    """What to tell the caller about a Workload ``requeue_blocked`` by ``reason``."""
    return (
        f"Workload {namespace}/{workload} was deactivated by Kueue itself ({reason}), and "
        "Kueue up to v0.19 does not run such a Workload again when it is reactivated: it "
        "deactivates it again at once while its DeactivationTarget condition stays True (a "
        "time limit), and otherwise never queues it (its Requeued condition stays False; "
        "kueue issue 14870, fixed in v0.20), so the job stays stopped. To run it again, "
        f"delete the Workload (kubectl delete workload -n {namespace} {workload}): Kueue "
        "makes a new, active one for the TrainJob, which the readmission gate admits as "
        "usual; or upgrade Kueue to v0.20 or later. If Kueue stopped it for good reason (its "
        "time or requeuing limit), fix that first"
    )


# ---- 2. the runtime a TrainJob names -----------------------------------------------------


@dataclass(frozen=True, order=True)
class RuntimeName:
    """The training runtime a TrainJob's ``spec.runtimeRef`` names."""

    kind: str
    name: str
    namespace: str | None
    """The TrainJob's namespace for a TrainingRuntime; None for a ClusterTrainingRuntime."""

    @property
    def resource(self) -> Resource:
        return TRAININGRUNTIME if self.namespace is not None else CLUSTERTRAININGRUNTIME

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace is not None else ""
        return f"{self.kind} {where}{self.name}"


def runtime_of(trainjob: object) -> RuntimeName | None:
    """The runtime ``spec.runtimeRef`` names, with Trainer's defaults (apiGroup
    ``trainer.kubeflow.org``, kind ``ClusterTrainingRuntime``); None when it names none, or
    one of another group or kind (nothing of Trainer's to look up)."""
    ref = objects.section(objects.section(trainjob, "spec"), "runtimeRef")
    name = ref.get("name")
    if not isinstance(name, str) or not name:
        return None
    if (ref.get("apiGroup") or TRAINJOB.group) != TRAINJOB.group:
        return None
    kind = ref.get("kind") or CLUSTERTRAININGRUNTIME.kind
    if kind == CLUSTERTRAININGRUNTIME.kind:
        return RuntimeName(kind, name, None)
    if kind == TRAININGRUNTIME.kind:
        return RuntimeName(kind, name, objects.namespace(trainjob) or "")
    return None


# Trainer v2.3's runtime plugins refuse with field.Invalid on spec.runtimeRef (TrainingRuntime)
# or spec.RuntimeRef (ClusterTrainingRuntime), "<get error>: specified trainingRuntime must
# be created before the TrainJob is created" (pkg/runtime/core, ValidateObjects).
_RUNTIME_REFUSAL_MARKS = (
    "specified trainingRuntime must be created before the TrainJob is created",
    "specified clusterTrainingRuntime must be created before the TrainJob is created",
)
# Kueue v0.19.2's TrainJob webhook ("vtrainjob.kb.io") resolves the runtime on every
# CREATE and UPDATE of a TrainJob too (its topology-aware-scheduling check builds the pod
# sets from it, with the feature on by default) and denies with "runtime '<name>' not
# found" (pkg/controller/jobs/trainjob). Validating webhooks run in parallel and which
# refusal the API server reports is not defined, so either may come back.
_KUEUE_RUNTIME_REFUSAL = re.compile(r"runtime '([^']*)' not found")


def is_runtime_refusal(status: int, message: str, name: str | None = None) -> bool:
    """The API server refused a TrainJob write because a webhook (Trainer's or Kueue's)
    could not find the runtime it names, and for nothing else. With ``name``, Kueue's
    refusal must name that runtime."""
    if status not in (400, 403, 422):
        return False
    if any(mark in message for mark in _RUNTIME_REFUSAL_MARKS) and "not found" in message:
        return True
    found = _KUEUE_RUNTIME_REFUSAL.search(message)
    return found is not None and (name is None or found.group(1) == name)


def runtime_missing_message(what: str, runtime: RuntimeName | None, refusal: str) -> str:
    """RuntimeMissing's message: the call, the runtime, what to do, and the API server's
    own words (``refusal``; empty when the runtime was found missing before writing)."""
    named = str(runtime) if runtime is not None else "the runtime its spec.runtimeRef names"
    text = (
        f"{what}: {named} does not exist, and Trainer's webhook (and Kueue's) refuses every "
        "update of a TrainJob whose runtime is gone (Trainer v2.3 reads it on each update "
        "and no longer keeps it with a finalizer): nothing was written and the hold, if any, "
        "stays in "
        f"force. Re-create {named} (the same name and kind), then call again; or delete the "
        "TrainJob"
    )
    return f"{text}. The API server said: {refusal}" if refusal else text


def runtimes_capability(
    namespace: str,
    named: Sequence[tuple[str, RuntimeName]],
    present: frozenset[RuntimeName],
    *,
    unseen: Sequence[str] = (),
    truncated: bool = False,
) -> Capability:
    """Preflight's ``trainJobRuntimes``: every TrainJob of ``namespace`` (``named``: its
    name and runtime) names a runtime in ``present``.

    Invariant: unsupported exactly when a TrainJob names a runtime not in ``present`` and
    the lists that would hold it were read (``unseen`` names the lists that could not be)."""
    missing = [(job, rt) for job, rt in named if rt not in present]
    blind = {CLUSTERTRAININGRUNTIME.plural, TRAININGRUNTIME.plural}.intersection(unseen)
    shown = [
        (job, rt)
        for job, rt in missing
        if rt.resource.plural not in blind  # a list we could not read says nothing
    ]
    partial = " (the first page of TrainJobs only)" if truncated else ""
    could_not = f"; could not list {', '.join(sorted(unseen))}" if unseen else ""
    if shown:
        listed = ", ".join(f"TrainJob {namespace}/{job} names {rt}" for job, rt in shown[:10])
        more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
        return Capability(
            False,
            f"{listed}{more}, which does not exist{partial}: Trainer's webhook refuses every "
            "update of such a TrainJob, so its Release, the readmission gate's attempt raise "
            "and Kueue's own unsuspend all fail; re-create the runtime (Trainer v2.3 no "
            f"longer keeps a runtime in use from deletion){could_not}",
        )
    if not named:
        return Capability(True, f"no TrainJob in {namespace}{partial}{could_not}")
    return Capability(
        True,
        f"every TrainJob in {namespace} names a runtime that exists{partial}{could_not}",
    )


# ---- 3. a Trainer that ignores spec.managedBy -------------------------------------------


def _schema_at(crd: object, version: str, *path: str) -> Mapping[str, Any] | None:
    versions = objects.section(crd, "spec").get("versions")
    for entry in versions if isinstance(versions, list) else []:
        if objects.is_map(entry) and entry.get("name") == version:
            node = objects.section(objects.section(entry, "schema"), "openAPIV3Schema")
            for key in path:
                node = objects.section(objects.section(node, "properties"), key)
                if not node:
                    return None
            return node
    return None


def trainer_honours_managed_by(crd: object) -> bool | None:
    """Whether the Trainer whose TrainJob CRD this is honours ``spec.managedBy``.

    Trainer skips a TrainJob managed by someone else from v2.3 on; v2.2.1 and earlier
    create its JobSet whatever ``managedBy`` says. The CRD carries no version (no label,
    no annotation but controller-gen's), and ``managedBy`` is in the schema of both. What
    tells them apart is a change that came with v2.3: a CEL rule on
    ``spec.initializer.dataset.storageUri`` ("storageUri may be empty, or it must be a
    valid URI"). Present: v2.3 or later (True). Field there without the rule: v2.2 or
    earlier (False). No ``spec.managedBy`` at all: older still (False). Anything else (no
    such version, another shape): None, unknown.
    """
    spec = _schema_at(crd, TRAINJOB.version, "spec")
    properties = objects.section(spec, "properties")
    if spec is None or not properties:
        return None
    if not objects.section(properties, "managedBy"):
        return False
    uri = _schema_at(crd, TRAINJOB.version, "spec", "initializer", "dataset", "storageUri")
    if uri is None:
        return None
    rules = uri.get("x-kubernetes-validations")
    return isinstance(rules, list) and bool(rules)


def managed_by_capability(
    multikueue: Sequence[str], unseen: Sequence[str], trainer: bool | None, trainer_why: str
) -> Capability:
    """Preflight's ``trainerManagedBy`` (Kueue mode), a condition of Hold.

    ``multikueue``: what shows MultiKueue in use (objects seen); ``unseen``: what could not
    be read to tell; ``trainer``: ``trainer_honours_managed_by``, with ``trainer_why`` (what
    was read, or why it could not be).

    Invariant: unsupported exactly when MultiKueue was seen and Trainer was seen to ignore
    ``spec.managedBy``; whatever could not be seen is said in the reason.
    """
    blind = f" (could not read {', '.join(unseen)})" if unseen else ""
    if not multikueue:
        return Capability(True, f"no MultiKueue in use seen here{blind}")
    seen = ", ".join(multikueue)
    if trainer is False:
        return Capability(
            False,
            f"MultiKueue is in use here ({seen}) and the installed Trainer ignores "
            f"spec.managedBy ({trainer_why}: v2.2 or earlier): a TrainJob Kueue dispatches to "
            "a worker cluster also runs on this one, so a held and released job would run "
            "twice; upgrade Trainer to v2.3 or later before holding jobs here",
        )
    if trainer is None:
        return Capability(
            True,
            f"MultiKueue is in use here ({seen}), and whether the installed Trainer honours "
            f"spec.managedBy is unknown ({trainer_why}); Trainer v2.2 or earlier would run a "
            "dispatched TrainJob here too: check that Trainer is v2.3 or later",
        )
    return Capability(
        True,
        f"MultiKueue is in use here ({seen}) and the installed Trainer honours "
        f"spec.managedBy ({trainer_why})",
    )


def multikueue_evidence(
    admission_checks: Sequence[object], clusters: Sequence[object], configs: Sequence[object]
) -> list[str]:
    """What shows MultiKueue in use: AdmissionChecks whose controllerName is MultiKueue's,
    MultiKueueClusters, MultiKueueConfigs, each named."""
    found = [
        f"AdmissionCheck {objects.name(check)}"
        for check in admission_checks
        if objects.section(check, "spec").get("controllerName") == MULTIKUEUE_CONTROLLER
    ]
    found += [f"MultiKueueCluster {objects.name(c)}" for c in clusters]
    found += [f"MultiKueueConfig {objects.name(c)}" for c in configs]
    return found


# ---- 4. Kueue's force deletion and retention --------------------------------------------


@dataclass(frozen=True)
class KueueSettings:
    """What Kueue's configuration file says about the two settings that act on held jobs."""

    failure_recovery: bool | None
    """featureGates.FailureRecoveryPolicy; None when the file does not set it (off by
    default in v0.19; the gate may also be set on Kueue's command line, which is not here)."""
    after_deactivated_by_kueue: str | None
    """objectRetentionPolicies.workloads.afterDeactivatedByKueue as written; None: unset."""
    feature_gates_set: bool = False
    """The file has a ``featureGates`` mapping. Kueue (v0.17 to v0.19 at least) then
    refuses to start with a ``--feature-gates`` flag too ("feature gates for CLI and
    configuration cannot both specified"), so a gate the mapping leaves out is at its
    default; without the mapping, the flag (which Kueue's Helm chart uses for
    ``controllerManager.featureGates``) may set it, unseen here."""


def kueue_settings(text: str) -> KueueSettings:
    """Parse Kueue's configuration (the ConfigMap's ``controller_manager_config.yaml``).
    Raises ValueError saying what is wrong with it."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{KUEUE_CONFIG_KEY} is not YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError(f"{KUEUE_CONFIG_KEY} is not a mapping")
    gates = doc.get("featureGates")
    gate = gates.get(FAILURE_RECOVERY_FEATURE_GATE) if isinstance(gates, dict) else None
    workloads = objects.section(objects.section(doc, "objectRetentionPolicies"), "workloads")
    after = workloads.get("afterDeactivatedByKueue")
    return KueueSettings(
        failure_recovery=gate if isinstance(gate, bool) else None,
        after_deactivated_by_kueue=None if after is None else str(after),
        feature_gates_set=isinstance(gates, dict),
    )


def annotated_for_force_delete(pods: Sequence[object]) -> list[str]:
    """The names of the pods that opt in to Kueue's FailureRecoveryPolicy, sorted."""
    return sorted(
        str(objects.name(pod))
        for pod in pods
        if objects.annotation(pod, SAFE_TO_FORCEFULLY_DELETE_ANNOTATION) == "true"
    )


def force_delete_capability(
    namespace: str,
    annotated: Sequence[str],
    pods_error: str | None,
    settings: KueueSettings | None,
    settings_error: str | None,
) -> Capability:
    """Preflight's ``kueueForceDelete``: no pod of a TrainJob here opts in to Kueue's
    FailureRecoveryPolicy, and Kueue's configuration does not turn it on.

    Why it matters: the readmission gate (and a plain-mode Release) counts a pod as gone
    once its object is; Kueue force-deletes an opted-in pod stuck Terminating on an
    unreachable node, while that node may still run it. Reported, not a condition of Hold.
    """
    where = f"{KUEUE_CONFIG_MAP}'s {KUEUE_CONFIG_KEY}"
    gate_on = settings is not None and settings.failure_recovery is True
    problems: list[str] = []
    if annotated:
        more = f" and {len(annotated) - 10} more" if len(annotated) > 10 else ""
        shown = ", ".join(annotated[:10]) + more
        problems.append(
            f"pods of TrainJobs in {namespace} carry {SAFE_TO_FORCEFULLY_DELETE_ANNOTATION}"
            f"=true ({shown})"
        )
    if gate_on:
        problems.append(f"{where} turns on the {FAILURE_RECOVERY_FEATURE_GATE} feature gate")
    unseen: list[str] = []
    if pods_error:
        unseen.append(pods_error)
    if settings_error:
        unseen.append(settings_error)
    elif (
        settings is not None
        and settings.failure_recovery is None
        and not settings.feature_gates_set
    ):
        unseen.append(
            f"{where} sets no featureGates, so Kueue's --feature-gates flag (where Kueue's "
            "Helm chart puts controllerManager.featureGates), which is not visible here, may "
            f"turn {FAILURE_RECOVERY_FEATURE_GATE} on (it is off by default)"
        )
    blind = f"; not seen: {'; '.join(unseen)}" if unseen else ""
    if problems:
        return Capability(
            False,
            f"{' and '.join(problems)}: with {FAILURE_RECOVERY_FEATURE_GATE} on, Kueue "
            "force-deletes such a pod a minute past its deletionTimestamp (its grace period "
            "plus a minute after its deletion) when its node is tainted unreachable, and the "
            "readmission gate then counts it gone although the "
            "lost node may still run it, so a released job can run twice; remove the "
            "annotation from the pod templates of held jobs "
            "(docs/explanation/readmission-gate.md, "
            f"\"What 'gone' means\"){blind}",
        )
    return Capability(True, f"no pod here opts in to Kueue's force deletion{blind}")


def retention_capability(settings: KueueSettings | None, settings_error: str | None) -> Capability:
    """Preflight's ``kueueRetention``: Kueue is not configured to delete jobs it deactivated
    (``objectRetentionPolicies.workloads.afterDeactivatedByKueue``). A job Kueue deactivated
    and the supervisor then held is deleted by Kueue when that time runs out, hold or no
    hold (the Workload's Evicted reason stays Kueue's), if Kueue may delete TrainJobs:
    v0.19.2's upstream ClusterRole may not, and Kueue's delete is refused (seen on the real
    Kueue, tests/real/test_kueue_retention.py). Reported, not a condition of Hold."""
    if settings is None:
        return Capability(
            True,
            f"Kueue's configuration is not known here ({settings_error or 'unknown'}); if "
            "objectRetentionPolicies.workloads.afterDeactivatedByKueue is set, Kueue deletes "
            "a job it deactivated even while it is held",
        )
    after = settings.after_deactivated_by_kueue
    if after is None:
        return Capability(
            True, "Kueue's objectRetentionPolicies.workloads.afterDeactivatedByKueue is unset"
        )
    return Capability(
        False,
        f"Kueue's objectRetentionPolicies.workloads.afterDeactivatedByKueue is {after}: "
        f"Kueue deletes a TrainJob {after} after deactivating it itself (its maximum "
        "execution time, requeuing limit or a rejected AdmissionCheck), even while "
        "holdwarden holds it, and the job, its Workload and its hold are gone (Kueue "
        "v0.19.2's own ClusterRole has no delete on trainjobs: there Kueue tries, is "
        "refused and retries until delete is granted); unset it in Kueue's configuration, "
        "or release or re-create such jobs before then",
    )
