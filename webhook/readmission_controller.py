"""The readmission gate's I/O: a small AdmissionCheck controller run by ``holdwarden serve``.

Each pass lists the AdmissionChecks whose ``spec.controllerName`` is ours (keeping their
``Active`` condition true) and the Workloads, and for each Workload carrying one of our
checks reads its TrainJob and counts the job's pods, then applies
``webhook.readmission.decide_readmission``. Every write is an update preconditioned on
the resourceVersion it was decided on; a conflict just means "decide again next pass".

Polling, not watching: a pass costs one list of Workloads plus a read per gated Workload,
which suits the scale of a training cluster; a watch-based informer is the upgrade path if
that ever matters (noted in docs/enforcer.md).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from holdwarden import objects
from holdwarden.config import Config
from holdwarden.vocabulary import JOBSET_NAME_LABEL, TRAINJOB, WORKLOAD, Annotations
from webhook.readmission import GateAction, GateDecision, decide_readmission

log = logging.getLogger("holdwarden.readmission")

ADMISSION_CHECK_GROUP, ADMISSION_CHECK_VERSION, ADMISSION_CHECKS = (
    "kueue.x-k8s.io",
    "v1beta2",
    "admissionchecks",
)
_FIELD_MANAGER = "holdwarden-readmission"
_MAX_STEPS = 3  # MARK_READY then RAISE_ATTEMPT, with room for one re-read


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ReadmissionGate:
    """Runs passes of the gate, in a thread (``start``/``stop``) or one at a time (``run_once``)."""

    def __init__(
        self,
        config: Config,
        api_client: k8s.ApiClient,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.config = config
        self.annotations = Annotations(config.annotation_prefix)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.errors = 0
        self.applied: Counter[GateAction] = Counter()
        """Writes applied, by action (for tests and the log)."""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="readmission-gate", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        interval = self.config.readmission.interval.total_seconds()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                # A failed pass must not end the gate; the next pass decides afresh.
                self.errors += 1
                log.exception("readmission pass failed")
            self._stop.wait(interval)

    # -- one pass ----------------------------------------------------------------------

    def our_checks(self) -> frozenset[str]:
        """Names of the AdmissionChecks we serve; marks each one Active."""
        listed: Any = self._custom.list_cluster_custom_object(
            ADMISSION_CHECK_GROUP, ADMISSION_CHECK_VERSION, ADMISSION_CHECKS
        )
        names = set()
        for check in listed.get("items", []):
            if (check.get("spec") or {}).get("controllerName") != (
                self.config.readmission.controller_name
            ):
                continue
            names.add(check["metadata"]["name"])
            self._keep_active(check)
        return frozenset(names)

    def _keep_active(self, check: dict[str, Any]) -> None:
        conditions = (check.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions):
            return
        others = [c for c in conditions if c.get("type") != "Active"]
        check.setdefault("status", {})["conditions"] = [
            *others,
            {
                "type": "Active",
                "status": "True",
                "reason": "Active",
                "message": "holdwarden readmission gate is serving this check",
                "lastTransitionTime": objects.format_time(self._clock()),
            },
        ]
        try:
            self._custom.replace_cluster_custom_object_status(
                ADMISSION_CHECK_GROUP,
                ADMISSION_CHECK_VERSION,
                ADMISSION_CHECKS,
                check["metadata"]["name"],
                check,
                field_manager=_FIELD_MANAGER,
            )
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise

    def run_once(self) -> list[tuple[str, GateDecision]]:
        """One pass over every Workload; returns what was decided, for tests and logs."""
        self.passes += 1
        checks = self.our_checks()
        if not checks:
            return []
        listed: Any = self._custom.list_cluster_custom_object(
            WORKLOAD.group, WORKLOAD.version, WORKLOAD.plural
        )
        decided: list[tuple[str, GateDecision]] = []
        for workload in listed.get("items", []):
            names = {
                c.get("name") for c in (workload.get("status") or {}).get("admissionChecks") or []
            }
            if not names & checks:
                continue
            key = f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"
            decided.extend((key, d) for d in self._gate(workload, checks))
        return decided

    def _gate(self, workload: dict[str, Any], checks: frozenset[str]) -> list[GateDecision]:
        decisions = []
        for _ in range(_MAX_STEPS):
            trainjob = self._trainjob_of(workload)
            pods = self._pods_remaining(workload, trainjob)
            decision = decide_readmission(
                workload,
                trainjob,
                pods,
                check_names=checks,
                annotations=self.annotations,
                now=self._clock(),
            )
            decisions.append(decision)
            if decision.action is GateAction.NOTHING:
                break
            try:
                workload = self._apply(decision, workload)
            except k8s.ApiException as exc:
                if exc.status in (404, 409):  # changed or gone under us: next pass decides
                    break
                raise
            self.applied[decision.action] += 1
            log.info(
                "readmission %s",
                decision.action.value,
                extra={
                    "fields": {
                        "workload": workload["metadata"]["name"],
                        "namespace": workload["metadata"]["namespace"],
                        "reason": decision.reason,
                    }
                },
            )
        return decisions

    def _apply(self, decision: GateDecision, workload: dict[str, Any]) -> dict[str, Any]:
        namespace = workload["metadata"]["namespace"]
        if decision.workload is not None:
            written: Any = self._custom.replace_namespaced_custom_object_status(
                WORKLOAD.group,
                WORKLOAD.version,
                namespace,
                WORKLOAD.plural,
                workload["metadata"]["name"],
                decision.workload,
                field_manager=_FIELD_MANAGER,
            )
            result: dict[str, Any] = written
            return result
        if decision.trainjob is not None:
            self._custom.replace_namespaced_custom_object(
                TRAINJOB.group,
                TRAINJOB.version,
                namespace,
                TRAINJOB.plural,
                decision.trainjob["metadata"]["name"],
                decision.trainjob,
                field_manager=_FIELD_MANAGER,
            )
        return workload

    def _trainjob_of(self, workload: dict[str, Any]) -> dict[str, Any] | None:
        owner = objects.controller_trainjob(workload)
        if owner is None:
            return None
        try:
            found: Any = self._custom.get_namespaced_custom_object(
                TRAINJOB.group,
                TRAINJOB.version,
                workload["metadata"]["namespace"],
                TRAINJOB.plural,
                owner.name,
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if found["metadata"]["uid"] != owner.uid:
            return None  # a new TrainJob of the same name: not this Workload's
        trainjob: dict[str, Any] = found
        return trainjob

    def _pods_remaining(self, workload: dict[str, Any], trainjob: dict[str, Any] | None) -> int:
        if trainjob is None:
            return 0
        pods = self._core.list_namespaced_pod(
            workload["metadata"]["namespace"],
            label_selector=f"{JOBSET_NAME_LABEL}={trainjob['metadata']['name']}",
        )
        return len(pods.items)
