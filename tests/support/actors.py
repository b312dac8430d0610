"""Test actors that play Kueue and Trainer against the real local control plane.

No Kueue or Trainer controller runs in the tests' control plane, so these actors do what
those controllers do to the objects holdwarden cares about, each as its controller's
service account (impersonation, so RBAC and ``managedFields`` see the right writer):

- ``KueueActor`` creates the Workload of a queue-labelled TrainJob, admits it, unsuspends
  the TrainJob, evicts a deactivated Workload and suspends the TrainJob (Kueue owns
  ``spec.suspend``), and writes Workload status every few hundred ms so resourceVersion
  conflicts are routine for anyone else writing the Workload.
- ``TrainerActor`` creates pods some time after a TrainJob is unsuspended and deletes them
  some time after it is suspended, so "pods remain" windows really happen.
- ``Watcher`` records every event of TrainJobs, Workloads and pods in a namespace, for the
  invariant checks of the interleaving test.

Invariants of every actor: one background thread, started and stopped by the context
manager; level-triggered (each tick re-reads the namespace, as a controller reconciles);
every write is a preconditioned PUT that, on a 409, re-reads and re-decides; an object
deleted under it is skipped. Any other exception is collected and ``stop()`` (or
``check()``) re-raises it as ``ActorError``, so a test never passes over a broken actor.
"""

from __future__ import annotations

import copy
import json
import secrets
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from kubernetes import client as k8s

from holdwarden.vocabulary import (
    DEACTIVATED_REASON,
    DEACTIVATION_TARGET_CONDITION,
    DEFAULT_ANNOTATION_PREFIX,
    EVICTED_CONDITION,
    JOB_UID_LABEL,
    JOBSET_NAME_LABEL,
    KUEUE_DEACTIVATED_DUE_TO_PREFIX,
    QUEUE_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    Resource,
)
from rig.builders import kueue_workload_body

Obj = dict[str, Any]

CLUSTER_QUEUE = "cluster-queue"
RESOURCE_FLAVOR = "default-flavor"
HEARTBEAT_CONDITION = "TestActorHeartbeat"
DECIDED_ON_ANNOTATION = "test.holdwarden.io/decided-on-rv"
"""On each pod the TrainerActor creates: the TrainJob resourceVersion it decided on."""
DECIDED_ON_WORKLOAD_ANNOTATION = "test.holdwarden.io/unsuspend-decided-on-workload-rv"
"""Written by the KueueActor with each unsuspend: the Workload resourceVersion it read."""
MAX_WRITE_TRIES = 50
KUEUE_RUNTIME_PATCH_MANAGER = "kueue.x-k8s.io/manager"
KUEUE_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
KUEUE_PODSET_LABEL = "kueue.x-k8s.io/podset"


def kueue_runtime_patch(workload_name: str, replicated_job: str = "node") -> Obj:
    """The ``spec.runtimePatches`` entry real Kueue writes when it starts a TrainJob."""
    pod_meta = {
        "labels": {KUEUE_PODSET_LABEL: replicated_job},
        "annotations": {KUEUE_WORKLOAD_ANNOTATION: workload_name},
    }
    return {
        "manager": KUEUE_RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": replicated_job,
                            "template": {"spec": {"template": {"metadata": pod_meta}}},
                        }
                    ]
                }
            }
        },
    }


class ActorError(AssertionError):
    """An actor (or watcher) thread met an unexpected error; the message has tracebacks."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(obj: Obj, type_: str, status: str, reason: str, message: str) -> None:
    """Set one metav1.Condition in ``obj.status.conditions`` (lastTransitionTime moves only
    when the status changes, as apimachinery's SetStatusCondition does)."""
    conds: list[Obj] = obj.setdefault("status", {}).setdefault("conditions", [])
    for cond in conds:
        if cond.get("type") == type_:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now_rfc3339()
            cond.update(status=status, reason=reason, message=message)
            return
    conds.append(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
    )


def remove_condition(obj: Obj, type_: str) -> None:
    status = obj.get("status") or {}
    conds = status.get("conditions") or []
    status["conditions"] = [c for c in conds if c.get("type") != type_]


def find_condition(obj: Obj, type_: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def condition_is_true(obj: Obj, type_: str) -> bool:
    cond = find_condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def controller_uid(obj: Obj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") is True:
            return str(ref.get("uid"))
    return None


def is_suspended(trainjob: Obj) -> bool:
    return (trainjob.get("spec") or {}).get("suspend") is True


def is_active(workload: Obj) -> bool:
    return (workload.get("spec") or {}).get("active", True) is not False


def has_ended(trainjob: Obj) -> bool:
    return condition_is_true(trainjob, "Complete") or condition_is_true(trainjob, "Failed")


class _ObjectIO:
    """Reads and preconditioned writes of one namespace's custom objects, as one identity."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)

    def _coords(self, res: Resource) -> tuple[str, str, str, str]:
        return (res.group, res.version, self.namespace, res.plural)

    def list_objects(self, res: Resource, label_selector: str | None = None) -> list[Obj]:
        kwargs: dict[str, Any] = {}
        if label_selector is not None:
            kwargs["label_selector"] = label_selector
        listed: Any = self.custom.list_namespaced_custom_object(*self._coords(res), **kwargs)
        items: list[Obj] = list(listed.get("items") or [])
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items

    def get(self, res: Resource, name: str) -> Obj | None:
        try:
            obj: Any = self.custom.get_namespaced_custom_object(*self._coords(res), name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def update(
        self,
        res: Resource,
        name: str,
        mutate: Callable[[Obj], bool],
        *,
        status: bool = False,
        first: Obj | None = None,
    ) -> Obj | None:
        """Read, ``mutate`` (returns whether it changed anything), PUT with the read's
        resourceVersion; on 409 re-read and re-decide. None if the object is gone or the
        mutation found nothing to change."""
        obj = copy.deepcopy(first) if first is not None else self.get(res, name)
        for _ in range(MAX_WRITE_TRIES):
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                return None
            if not mutate(obj):
                return None
            put = (
                self.custom.replace_namespaced_custom_object_status
                if status
                else self.custom.replace_namespaced_custom_object
            )
            try:
                written: Any = put(*self._coords(res), name, obj)
                return dict(written)
            except k8s.ApiException as exc:
                if exc.status == 404:
                    return None
                if exc.status != 409:
                    raise
            obj = self.get(res, name)
        raise ActorError(f"{res.plural}/{name}: {MAX_WRITE_TRIES} tries all met conflicts")

    def pods_of(self, trainjob_name: str) -> list[Any]:
        listed = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={trainjob_name}"
        )
        return list(listed.items)


class _Background:
    """A context manager that starts on entry and stops on exit, re-raising thread errors."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Do not mask the test's own failure with the actor's; but never lose either.
        try:
            self.stop()
        except ActorError:
            if exc is None:
                raise


class _Actor(_Background):
    """One background thread running ``_tick`` every ``interval`` seconds."""

    name = "actor"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: list[str] = []
        self._errors_lock = threading.Lock()
        self.ticks = 0

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and re-raise whatever it met (as ActorError)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                self._record(f"{self.name}: thread did not stop within 30 s")
        self.check()

    def check(self) -> None:
        """Raise ActorError if the thread has met an error so far."""
        with self._errors_lock:
            errors = list(self._errors)
        if errors:
            raise ActorError(f"{self.name} met {len(errors)} error(s):\n" + "\n".join(errors))

    def _record(self, text: str) -> None:
        with self._errors_lock:
            self._errors.append(text)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:
                self._record(traceback.format_exc())
            self.ticks += 1
            self._stop.wait(self.interval)

    def _tick(self) -> None:
        raise NotImplementedError


class KueueActor(_Actor):
    """Plays Kueue (and, with ``readmission_gate``, holdwarden's readmission gate) in one
    namespace, as Kueue's service account.

    Per queue-labelled TrainJob:
    - no Workload → create one as Kueue does: label ``kueue.x-k8s.io/job-uid=<uid>``, a
      controller ownerReference, name ``trainjob-<name>-<5 hex>``; a running TrainJob without
      an admitted Workload is suspended (Kueue's webhook and job reconciler do this);
    - Workload active, not admitted, gate open → status QuotaReserved+Admitted with
      ``admission.podSetAssignments`` matching ``spec.podSets`` (the CRD's CEL rule), Evicted
      reset to False, then the TrainJob unsuspended;
    - Workload inactive → Evicted=True with reason ``Deactivated`` (or
      ``DeactivatedDueTo<Cause>`` after ``deactivate``), the TrainJob suspended, then
      admission cleared (QuotaReserved/Admitted False), in Kueue's order;
    - every ``heartbeat`` seconds a status write (condition ``TestActorHeartbeat``), so
      writers of the Workload meet 409s routinely.

    The readmission gate is holdwarden's AdmissionCheck (design: "Kueue mode, Open and the
    readmission gate"). With ``admission_check`` set, the actor does what Kueue does with
    an AdmissionCheck and the real gate (``holdwarden.readmission.controller``) decides: the
    check is listed ``Pending`` on each Workload, reset to ``Pending`` on eviction, and the
    Workload is admitted only while the check is ``Ready``. Without it, and with
    ``readmission_gate`` on, the actor plays the gate itself: it admits only what the gate
    would let through (TrainJob opened, no hold annotation on the Workload, no pod of the
    TrainJob left; it does not raise P/attempt).
    """

    name = "kueue-actor"

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        *,
        interval: float = 0.05,
        heartbeat: float | None = 0.3,
        readmission_gate: bool = True,
        admission_check: str | None = None,
        annotation_prefix: str = DEFAULT_ANNOTATION_PREFIX,
    ) -> None:
        super().__init__(interval)
        self.admission_check = admission_check
        self.io = _ObjectIO(api, namespace)
        self.heartbeat = heartbeat
        self.readmission_gate = readmission_gate
        self.annotations = Annotations(annotation_prefix)
        self._last_beat: dict[str, float] = {}
        self._beats = 0
        # workload name -> (Kueue's own deactivation cause, generation that deactivated it)
        self._causes: dict[str, tuple[str, int | None]] = {}
        self._lock = threading.Lock()
        self.admissions = 0
        self.evictions = 0
        self.heartbeats = 0

    # ---- what a test asks of Kueue ---------------------------------------------------

    def workload_of(self, trainjob_name: str) -> Obj | None:
        """The Workload this actor created for the TrainJob (by job-uid + controller)."""
        trainjob = self.io.get(TRAINJOB, trainjob_name)
        if trainjob is None:
            return None
        uid = trainjob["metadata"]["uid"]
        for wl in self.io.list_objects(WORKLOAD, f"{JOB_UID_LABEL}={uid}"):
            if controller_uid(wl) == uid:
                return wl
        return None

    def deactivate(
        self, trainjob_name: str, cause: str = "MaximumExecutionTimeExceeded"
    ) -> Obj | None:
        """Kueue's own deactivation: DeactivationTarget, then ``spec.active=false``; the
        eviction that follows carries reason ``DeactivatedDueTo<cause>``."""
        workload = self.workload_of(trainjob_name)
        if workload is None:
            raise ActorError(f"{trainjob_name} has no Workload to deactivate")
        name = workload["metadata"]["name"]
        with self._lock:
            # Pending until the write lands: the loop must not forget it meanwhile.
            self._causes[name] = (cause, None)
        reason = KUEUE_DEACTIVATED_DUE_TO_PREFIX + cause

        def target(obj: Obj) -> bool:
            set_condition(obj, DEACTIVATION_TARGET_CONDITION, "True", reason, f"{cause}")
            return True

        self.io.update(WORKLOAD, name, target, status=True)

        def inactive(obj: Obj) -> bool:
            if not is_active(obj):
                return False
            obj["spec"]["active"] = False
            return True

        written = self.io.update(WORKLOAD, name, inactive)
        with self._lock:
            generation = int((written or workload)["metadata"].get("generation", 0))
            self._causes[name] = (cause, generation)
        return self.io.get(WORKLOAD, name)

    # ---- the reconcile loop ------------------------------------------------------------

    def _tick(self) -> None:
        trainjobs = self.io.list_objects(TRAINJOB)
        workloads = self.io.list_objects(WORKLOAD)
        by_owner: dict[str, Obj] = {}
        for wl in workloads:
            uid = controller_uid(wl)
            if uid is not None and not wl["metadata"].get("deletionTimestamp"):
                by_owner[uid] = wl
        for trainjob in trainjobs:
            labels = trainjob["metadata"].get("labels") or {}
            if not labels.get(QUEUE_NAME_LABEL) or trainjob["metadata"].get("deletionTimestamp"):
                continue
            workload = by_owner.get(trainjob["metadata"]["uid"])
            if workload is None:
                self._create_workload(trainjob, labels[QUEUE_NAME_LABEL])
                continue
            self._reconcile(trainjob, workload)
        self._beat(workloads)

    def _create_workload(self, trainjob: Obj, queue: str) -> None:
        name = trainjob["metadata"]["name"]
        body: Obj = kueue_workload_body(
            trainjob,
            queue=queue,
            count=2,
            requests={"cpu": "1"},
        )
        self.io.custom.create_namespaced_custom_object(*self.io._coords(WORKLOAD), body)
        if not is_suspended(trainjob):
            self._set_suspend(name, True)

    def _reserved(self, workload: Obj) -> bool:
        """Quota is reserved (Kueue's first step; with admission checks, admission waits)."""
        return condition_is_true(workload, "QuotaReserved") or bool(
            (workload.get("status") or {}).get("admission")
        )

    def _admitted(self, workload: Obj) -> bool:
        """Admitted: quota reserved and every admission check Ready (Kueue's second step)."""
        return condition_is_true(workload, "Admitted")

    def _check_state(self, workload: Obj) -> str | None:
        for check in (workload.get("status") or {}).get("admissionChecks") or []:
            if check.get("name") == self.admission_check:
                return str(check.get("state"))
        return None

    def _list_check(self, workload: Obj, state: str = "Pending") -> bool:
        """Kueue's part of an AdmissionCheck: list it on the Workload (mutates ``workload``)."""
        checks = workload.setdefault("status", {}).setdefault("admissionChecks", [])
        others = [c for c in checks if c.get("name") != self.admission_check]
        current = next((c for c in checks if c.get("name") == self.admission_check), None)
        if current is not None and current.get("state") == state:
            return False
        others.append(
            {
                "name": self.admission_check,
                "state": state,
                "message": "",
                "lastTransitionTime": now_rfc3339(),
            }
        )
        workload["status"]["admissionChecks"] = others
        if not self._reserved(workload):
            set_condition(
                workload,
                "Admitted",
                "False",
                "NoReservationUnsatisfiedChecks",
                "The workload has no reservation and not all checks ready",
            )
        return True

    def _assign(self, obj: Obj) -> None:
        """Reserve quota: ``status.admission`` matching ``spec.podSets`` (the CRD's CEL)."""
        status = obj.setdefault("status", {})
        status["admission"] = {
            "clusterQueue": CLUSTER_QUEUE,
            "podSetAssignments": [
                {
                    "name": ps.get("name", "main"),
                    "count": ps.get("count", 1),
                    "flavors": {"cpu": RESOURCE_FLAVOR},
                    "resourceUsage": {"cpu": str(ps.get("count", 1))},
                }
                for ps in obj["spec"]["podSets"]
            ],
        }
        set_condition(
            obj, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in {CLUSTER_QUEUE}"
        )
        if find_condition(obj, EVICTED_CONDITION) is not None:
            set_condition(obj, EVICTED_CONDITION, "False", "QuotaReserved", "Previously evicted")
        status.pop("requeueState", None)

    def _reserve(self, workload: Obj) -> None:
        """Kueue's first step with admission checks: quota reserved, not yet admitted."""

        def reserve(obj: Obj) -> bool:
            if not is_active(obj) or self._reserved(obj):
                return False
            self._assign(obj)
            set_condition(
                obj,
                "Admitted",
                "False",
                "UnsatisfiedChecks",
                "The workload has not all admission checks",
            )
            return True

        self.io.update(WORKLOAD, workload["metadata"]["name"], reserve, status=True)

    def _gate_open(self, trainjob: Obj, workload: Obj) -> bool:
        """Without an AdmissionCheck: the gate the actor plays itself (or none)."""
        if not self.readmission_gate:
            return True
        if not annotations_of(trainjob).get(self.annotations.opened):
            return False
        if self.annotations.hold_instance in annotations_of(workload):
            return False
        return not self.io.pods_of(trainjob["metadata"]["name"])

    def _reconcile(self, trainjob: Obj, workload: Obj) -> None:
        tj_name = trainjob["metadata"]["name"]
        wl_name = workload["metadata"]["name"]
        if not is_active(workload):
            evicted = find_condition(workload, EVICTED_CONDITION) or {}
            if (
                evicted.get("status") != "True"
                or evicted.get("reason") != self._eviction_reason(wl_name)
                or self._reserved(workload)
            ):
                self._evict(trainjob, workload)
            elif not is_suspended(trainjob):
                self._set_suspend(tj_name, True)
            return
        with self._lock:
            # Reactivated after Kueue's own deactivation: the cause is history.
            pending = self._causes.get(wl_name)
            generation = int(workload["metadata"].get("generation", 0))
            if pending is not None and pending[1] is not None and generation > pending[1]:
                del self._causes[wl_name]
        if has_ended(trainjob):
            return
        if self._admitted(workload):
            if is_suspended(trainjob):
                self._unsuspend(tj_name, wl_name)
            return
        if not is_suspended(trainjob):
            # Running without an admitted Workload: Kueue stops it.
            self._set_suspend(tj_name, True)
            return
        if self.admission_check is not None:
            # Real Kueue, seen with v0.19.2: quota is reserved first and kept while the
            # check is Pending (even for a job not opened yet); Admitted follows once it is
            # Ready.
            if self._check_state(workload) is None:
                self.io.update(WORKLOAD, wl_name, self._list_check, status=True)
            elif not self._reserved(workload):
                self._reserve(workload)
            elif self._check_state(workload) == "Ready":
                self._admit(workload)
                self._unsuspend(tj_name, wl_name)
            return
        if self._gate_open(trainjob, workload):
            self._admit(workload)
            self._unsuspend(tj_name, wl_name)

    def _admit(self, workload: Obj) -> None:
        def admit(obj: Obj) -> bool:
            if not is_active(obj) or self._admitted(obj):
                return False
            if self.admission_check is not None and (
                self._check_state(obj) != "Ready" or not self._reserved(obj)
            ):
                return False
            if (
                self.admission_check is None
                and self.readmission_gate
                and self.annotations.hold_instance in annotations_of(obj)
            ):
                return False
            if not self._reserved(obj):
                self._assign(obj)  # no checks: reservation and admission in one step
            set_condition(obj, "Admitted", "True", "Admitted", "The workload is admitted")
            return True

        if self.io.update(WORKLOAD, workload["metadata"]["name"], admit, status=True):
            self.admissions += 1

    def _eviction_reason(self, wl_name: str) -> str:
        with self._lock:
            pending = self._causes.get(wl_name)
        return KUEUE_DEACTIVATED_DUE_TO_PREFIX + pending[0] if pending else DEACTIVATED_REASON

    def _evict(self, trainjob: Obj, workload: Obj) -> None:
        wl_name = workload["metadata"]["name"]
        reason = self._eviction_reason(wl_name)

        cause = (
            reason.removeprefix(KUEUE_DEACTIVATED_DUE_TO_PREFIX)
            if reason != (DEACTIVATED_REASON)
            else ""
        )

        def evicted(obj: Obj) -> bool:
            if is_active(obj):
                return False
            set_condition(obj, EVICTED_CONDITION, "True", reason, "The workload is deactivated")
            # As real Kueue: Requeued=False/Deactivated, and eviction statistics keyed by
            # reason "Deactivated" and the underlying cause ("" for a manual deactivation).
            set_condition(
                obj, "Requeued", "False", DEACTIVATED_REASON, "The workload is deactivated"
            )
            stats = obj.setdefault("status", {}).setdefault("schedulingStats", {})
            evictions = stats.setdefault("evictions", [])
            for entry in evictions:
                if (
                    entry.get("reason") == DEACTIVATED_REASON
                    and entry.get("underlyingCause") == cause
                ):
                    entry["count"] = int(entry.get("count", 0)) + 1
                    break
            else:
                evictions.append(
                    {"reason": DEACTIVATED_REASON, "underlyingCause": cause, "count": 1}
                )
            if self.admission_check is not None:
                # Kueue resets every admission check on eviction.
                self._list_check(obj, "Pending")
            return True

        if self.io.update(WORKLOAD, wl_name, evicted, status=True) is None:
            return
        self.evictions += 1
        # Kueue's job reconciler stops the job, then gives the quota back.
        self._set_suspend(trainjob["metadata"]["name"], True)

        def unreserve(obj: Obj) -> bool:
            # Once evicted, the quota goes back even if the Workload was reactivated in the
            # meantime: like Kueue, a re-activated Workload must be admitted afresh (through
            # its admission checks), never resume on the old reservation.
            if (find_condition(obj, EVICTED_CONDITION) or {}).get("status") != "True":
                return False
            status = obj.setdefault("status", {})
            status.pop("admission", None)
            set_condition(obj, "QuotaReserved", "False", "Pending", "The workload is deactivated")
            no_checks = self.admission_check is not None and self._check_state(obj) != "Ready"
            set_condition(
                obj,
                "Admitted",
                "False",
                "NoReservationUnsatisfiedChecks" if no_checks else "NoReservation",
                "No quota reserved",
            )
            remove_condition(obj, DEACTIVATION_TARGET_CONDITION)
            return True

        self.io.update(WORKLOAD, wl_name, unreserve, status=True)

    def _unsuspend(self, trainjob_name: str, wl_name: str) -> None:
        """Run the job of an admitted, active Workload (read again just before), noting on
        the TrainJob which Workload resourceVersion the decision was made on."""
        workload = self.io.get(WORKLOAD, wl_name)
        if workload is None or not is_active(workload) or not self._admitted(workload):
            return
        decided_on = workload["metadata"]["resourceVersion"]

        def mutate(obj: Obj) -> bool:
            if not is_suspended(obj):
                return False
            obj["spec"]["suspend"] = False
            # As real Kueue starting a TrainJob: its own runtime patch (pod labels and the
            # Workload's name), in the same write as the unsuspend.
            patches = [
                p
                for p in obj["spec"].get("runtimePatches") or []
                if p.get("manager") != KUEUE_RUNTIME_PATCH_MANAGER
            ]
            patches.append(kueue_runtime_patch(wl_name))
            obj["spec"]["runtimePatches"] = patches
            meta = obj["metadata"]
            meta.setdefault("annotations", {})[DECIDED_ON_WORKLOAD_ANNOTATION] = decided_on
            return True

        self.io.update(TRAINJOB, trainjob_name, mutate)

    def _set_suspend(self, trainjob_name: str, suspend: bool) -> None:
        def mutate(obj: Obj) -> bool:
            if is_suspended(obj) == suspend:
                return False
            spec = obj.setdefault("spec", {})
            spec["suspend"] = suspend
            if suspend and spec.get("runtimePatches"):
                # Stopping restores the job: Kueue removes its own runtime patch.
                kept = [
                    p
                    for p in spec["runtimePatches"]
                    if p.get("manager") != KUEUE_RUNTIME_PATCH_MANAGER
                ]
                if kept:
                    spec["runtimePatches"] = kept
                else:
                    spec.pop("runtimePatches")
            return True

        self.io.update(TRAINJOB, trainjob_name, mutate)

    def _beat(self, workloads: list[Obj]) -> None:
        if self.heartbeat is None:
            return
        now = time.monotonic()
        for wl in workloads:
            name = wl["metadata"]["name"]
            if now - self._last_beat.get(name, 0.0) < self.heartbeat:
                continue
            self._last_beat[name] = now
            self._beats += 1
            beat = self._beats

            def touch(obj: Obj, beat: int = beat) -> bool:
                set_condition(obj, HEARTBEAT_CONDITION, "True", "Beat", f"beat {beat}")
                return True

            if self.io.update(WORKLOAD, name, touch, status=True, first=wl) is not None:
                self.heartbeats += 1


class TrainerActor(_Actor):
    """Plays Trainer (and JobSet) in one namespace, as Trainer's service account.

    - A TrainJob seen unsuspended (and not ended) with no pods gets ``pods_per_job`` pods
      (label ``jobset.sigs.k8s.io/jobset-name=<name>``) once it has stayed unsuspended for
      ``create_delay`` s; the TrainJob is read again right before each pod is created, and the
      resourceVersion decided on is written on the pod (annotation ``DECIDED_ON_ANNOTATION``).
    - A TrainJob seen suspended with pods loses them once it has stayed suspended for
      ``delete_delay`` s (read again right before deleting). Pods of a TrainJob that is gone
      are deleted at once.
    - Every ``status_heartbeat`` s it writes TrainJob status (condition
      ``TestActorHeartbeat``), as Trainer updates status, so TrainJob writers meet 409s.
    Pods stay Pending (no scheduler or kubelet) and are deleted at once.
    """

    name = "trainer-actor"

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        *,
        interval: float = 0.05,
        create_delay: float = 0.1,
        delete_delay: float = 0.5,
        pods_per_job: int = 2,
        status_heartbeat: float | None = 0.3,
        pods_api: k8s.ApiClient | None = None,
    ) -> None:
        super().__init__(interval)
        self.io = _ObjectIO(api, namespace)
        # Pods are written as kube-controller-manager's Job controller, as in a real cluster
        # (JobSet makes Jobs; the Job controller makes and deletes their pods).
        self.pods = k8s.CoreV1Api(pods_api) if pods_api is not None else self.io.core
        self.create_delay = create_delay
        self.delete_delay = delete_delay
        self.pods_per_job = pods_per_job
        self.status_heartbeat = status_heartbeat
        self._running_since: dict[str, float] = {}
        self._stopped_since: dict[str, float] = {}
        self._last_beat: dict[str, float] = {}
        self._beats = 0
        self.pods_created = 0
        self.pods_deleted = 0
        self.heartbeats = 0

    def _tick(self) -> None:
        trainjobs = {tj["metadata"]["name"]: tj for tj in self.io.list_objects(TRAINJOB)}
        pods: dict[str, list[Any]] = {}
        listed = self.io.core.list_namespaced_pod(
            self.io.namespace, label_selector=JOBSET_NAME_LABEL
        )
        for pod in listed.items:
            meta: Any = pod.metadata
            pods.setdefault(meta.labels[JOBSET_NAME_LABEL], []).append(pod)
        now = time.monotonic()
        for name, trainjob in trainjobs.items():
            have = pods.get(name, [])
            if not is_suspended(trainjob) and not has_ended(trainjob):
                self._stopped_since.pop(name, None)
                if have:
                    self._running_since.pop(name, None)
                    continue
                since = self._running_since.setdefault(name, now)
                if now - since >= self.create_delay:
                    self._create_pods(name)
                    self._running_since.pop(name, None)
            else:
                self._running_since.pop(name, None)
                if not have:
                    self._stopped_since.pop(name, None)
                    continue
                since = self._stopped_since.setdefault(name, now)
                if now - since >= self.delete_delay:
                    fresh = self.io.get(TRAINJOB, name)
                    if fresh is None or is_suspended(fresh) or has_ended(fresh):
                        self._delete(have)
                    self._stopped_since.pop(name, None)
        for name, have in pods.items():
            if name not in trainjobs:
                self._delete(have)
        self._beat(trainjobs)

    def _create_pods(self, name: str) -> None:
        for index in range(self.pods_per_job):
            fresh = self.io.get(TRAINJOB, name)
            if fresh is None or is_suspended(fresh) or has_ended(fresh):
                return
            pod = k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(
                    name=f"{name}-node-0-{index}-{secrets.token_hex(3)}",
                    labels={JOBSET_NAME_LABEL: name},
                    annotations={DECIDED_ON_ANNOTATION: fresh["metadata"]["resourceVersion"]},
                ),
                spec=k8s.V1PodSpec(
                    restart_policy="Never",
                    containers=[k8s.V1Container(name="node", image="busybox")],
                ),
            )
            self.pods.create_namespaced_pod(self.io.namespace, pod)
            self.pods_created += 1

    def _delete(self, pods: list[Any]) -> None:
        for pod in pods:
            try:
                self.pods.delete_namespaced_pod(pod.metadata.name, self.io.namespace)
                self.pods_deleted += 1
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise

    def _beat(self, trainjobs: dict[str, Obj]) -> None:
        if self.status_heartbeat is None:
            return
        now = time.monotonic()
        for name, trainjob in trainjobs.items():
            if now - self._last_beat.get(name, 0.0) < self.status_heartbeat:
                continue
            self._last_beat[name] = now
            self._beats += 1
            beat = self._beats

            def touch(obj: Obj, beat: int = beat) -> bool:
                set_condition(obj, HEARTBEAT_CONDITION, "True", "Beat", f"beat {beat}")
                return True

            if self.io.update(TRAINJOB, name, touch, status=True, first=trainjob) is not None:
                self.heartbeats += 1


# ---- the watcher ---------------------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    """One change the API server committed. ``rv`` is the object's resourceVersion after
    it: with one etcd behind the server it is etcd's global revision, so events of all
    kinds order by it (an assumption about the test's control plane, not the API)."""

    kind: str  # trainjob | workload | pod
    type: str  # ADDED | MODIFIED | DELETED
    rv: int
    obj: Obj

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


_KINDS: dict[str, str] = {
    "trainjob": f"/apis/{TRAINJOB.group}/{TRAINJOB.version}/namespaces/{{ns}}/{TRAINJOB.plural}",
    "workload": f"/apis/{WORKLOAD.group}/{WORKLOAD.version}/namespaces/{{ns}}/{WORKLOAD.plural}",
    "pod": "/api/v1/namespaces/{ns}/pods",
}


class Watcher(_Background):
    """Records every committed change of TrainJobs, Workloads and pods in a namespace.

    One thread per kind: a list (its items become ADDED events), then watches resumed from
    the last resourceVersion seen, so no change is missed while running. ``events()``
    returns them in resourceVersion order; ``stop()`` re-raises any thread error.
    """

    def __init__(self, api: k8s.ApiClient, namespace: str, *, poll_timeout: int = 1) -> None:
        self.api = api
        self.namespace = namespace
        self.poll_timeout = poll_timeout
        self._events: list[WatchEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Barrier(len(_KINDS) + 1)
        self._threads: list[threading.Thread] = []
        self._errors: list[str] = []
        self.last_rv: dict[str, int] = {}

    def start(self) -> None:
        for kind in _KINDS:
            thread = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        self._ready.wait(timeout=30)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.poll_timeout + 30)
        self.check()

    def check(self) -> None:
        if self._errors:
            raise ActorError("watcher met errors:\n" + "\n".join(self._errors))

    def events(self, since_rv: int = 0) -> list[WatchEvent]:
        with self._lock:
            events = [e for e in self._events if e.rv > since_rv]
        return sorted(events, key=lambda e: e.rv)

    def wait_until_seen(self, kind: str, rv: int, timeout: float = 10.0) -> None:
        """Wait until the ``kind`` stream has delivered resourceVersion ``rv`` (or later)."""
        deadline = time.monotonic() + timeout
        while self.last_rv.get(kind, 0) < rv:
            if time.monotonic() > deadline:
                raise ActorError(f"watch of {kind} did not reach rv {rv} in {timeout}s")
            time.sleep(0.01)

    def fence_pods(self, timeout: float = 30.0) -> str:
        """Wait until every pod event committed before this call has been recorded, and
        return the name of the fence pod used (callers leave it out of their counts).

        Why a pod: the pod stream's last resourceVersion only moves when a pod changes, so
        a DELETED already committed may still be on its way. A pod created now (unlabelled,
        so no actor touches it; deleted at once) is later than all of them: once its ADDED
        has arrived, nothing earlier is still in flight.
        """
        core = k8s.CoreV1Api(self.api)
        fence = core.create_namespaced_pod(
            self.namespace,
            k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(generate_name="fence-"),
                spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
            ),
        )
        fence_meta: Any = fence.metadata
        core.delete_namespaced_pod(fence_meta.name, self.namespace)
        self.wait_until_seen("pod", int(fence_meta.resource_version), timeout=timeout)
        return str(fence_meta.name)

    def _request(self, path: str, query: str) -> Any:
        url = f"{self.api.configuration.host}{path}?{query}"
        headers = {**self.api.default_headers, "Accept": "application/json"}
        return self.api.call_api("GET", url, header_params=headers, _request_timeout=None)

    def _run(self, kind: str) -> None:
        path = _KINDS[kind].format(ns=self.namespace)
        try:
            try:
                rv = self._list(kind, path)
            finally:
                self._ready.wait(timeout=30)
            while not self._stop.is_set():
                rv = self._watch(kind, path, rv)
        except Exception:
            self._errors.append(f"watch {kind}:\n{traceback.format_exc()}")

    def _list(self, kind: str, path: str) -> str:
        resp = self._request(path, "")
        data = json.loads(resp.read())
        if resp.status != 200:
            raise ActorError(f"list {path}: HTTP {resp.status}: {data}")
        with self._lock:
            for item in data.get("items") or []:
                self._add(kind, "ADDED", item)
        rv: str = data["metadata"]["resourceVersion"]
        self.last_rv[kind] = max(self.last_rv.get(kind, 0), int(rv))
        return rv

    def _add(self, kind: str, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._events.append(WatchEvent(kind, type_, rv, obj))

    def _watch(self, kind: str, path: str, rv: str) -> str:
        query = (
            f"watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
            f"&timeoutSeconds={self.poll_timeout}"
        )
        resp = self._request(path, query)
        if resp.status != 200:
            raise ActorError(f"watch {path}: HTTP {resp.status}: {resp.read()!r}")
        for line in _lines(resp.response):
            event = json.loads(line)
            obj = event["object"]
            if event["type"] == "ERROR":
                if obj.get("code") == 410:  # too old: list again (rare in short tests)
                    return self._list(kind, path)
                raise ActorError(f"watch {path}: {obj}")
            rv = obj["metadata"]["resourceVersion"]
            if event["type"] != "BOOKMARK":
                with self._lock:
                    self._add(kind, event["type"], obj)
            self.last_rv[kind] = max(self.last_rv.get(kind, 0), int(rv))
        return rv


def _lines(response: Any) -> Iterator[str]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8")
    if buffer.strip():
        yield buffer.decode("utf-8")
    response.release_conn()
