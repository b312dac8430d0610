"""The readmission gate's I/O: an AdmissionCheck controller run by ``holdwarden gate``.

Shape (client-go's): four informers (``holdwarden.readmission.informer``) keep watch caches of the
AdmissionChecks, the Workloads, the TrainJobs and the pods labelled
``jobset.sigs.k8s.io/jobset-name`` (the only pods the gate counts; slimmed to their metadata), all
cluster-wide. Every change enqueues the keys it can affect, a Workload's own key, or, for a TrainJob
or a pod, the keys of the Workloads that TrainJob controls, in a deduplicating, rate-limited work
queue (``holdwarden.readmission.workqueue``). One worker decides each key with
``holdwarden.readmission.decisions.decide_readmission``; every ``readmission.interval`` a resync
enqueues every gated Workload again (from the cache, no request) as a safety net.

Invariants kept:

- **Ready only when the pure decision says so, on fresh reads.** The cache decides when to
  look; it never grants. Before marking a check Ready (or raising A) the worker reads the
  TrainJob and counts the job's pods afresh from the apiserver and decides again with them,
  so a cache that lags (a pod it has not seen yet, an A it has not seen raised) cannot
  admit a second execution or count one twice.
- **Preconditioned writes.** Each write carries the resourceVersion of the object it was
  decided on (the cached Workload, the freshly read TrainJob); a 409 re-queues the key with
  backoff and the watch brings the newer object. A is raised only to the attempt the Ready
  check's message records, only if lower, so it rises exactly once per grant.
- **Only the leader writes.** With ``readmission.leaderElection`` the replicas campaign for
  a Lease (``holdwarden.leaderelection``); followers run the same informers (warm caches)
  and drop every key without writing; a new leader enqueues everything. Writes a deposed
  leader has on the wire are harmless, by the preconditions above.
- **Bounded requests.** Every request has ``_request_timeout`` (``timeouts.apiserverRequest``);
  every watch a server-side ``timeout_seconds`` (``readmission.watchTimeout``).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from holdwarden import objects
from holdwarden.config import Config
from holdwarden.leaderelection import ElectionTiming, LeaseElector, pod_namespace
from holdwarden.readmission.decisions import (
    GateAction,
    GateDecision,
    WorkerCount,
    decide_readmission,
    worker_blocker,
)
from holdwarden.readmission.informer import Informer, Obj, Store, object_key
from holdwarden.readmission.metrics import GateMetrics, StallTracker
from holdwarden.readmission.multikueue import WorkerClusters
from holdwarden.readmission.workqueue import WorkQueue
from holdwarden.vocabulary import (
    ADMISSIONCHECK,
    JOBSET_NAME_LABEL,
    TRAINJOB,
    WORKLOAD,
    Annotations,
)

log = logging.getLogger("holdwarden.readmission")

ADMISSION_CHECK_GROUP, ADMISSION_CHECK_VERSION, ADMISSION_CHECKS = (
    ADMISSIONCHECK.group,
    ADMISSIONCHECK.version,
    ADMISSIONCHECK.plural,
)
_FIELD_MANAGER = "holdwarden-readmission"
# Confirm on fresh reads, MARK_READY, then RAISE_ATTEMPT, with room for one more decision.
_MAX_STEPS = 4
_CHECK, _WORKLOAD = "check", "workload"
WorkKey = tuple[str, str]
"""("check", name) or ("workload", "namespace/name")."""

T = TypeVar("T")


def _utc_now() -> datetime:
    return datetime.now(UTC)


# ---- indexes ---------------------------------------------------------------------------


def _owner_index(workload: Obj) -> list[str]:
    """A Workload is found under ``namespace/<its controller TrainJob's name>``."""
    owner = objects.controller_trainjob(workload)
    namespace = objects.section(workload, "metadata").get("namespace")
    return [f"{namespace}/{owner.name}"] if owner is not None else []


def _check_index(workload: Obj) -> list[str]:
    """A Workload is found under each AdmissionCheck name its status lists."""
    return objects.admission_check_names(workload)


def _pod_job(pod: Obj) -> str | None:
    job = objects.labels(pod).get(JOBSET_NAME_LABEL)
    namespace = objects.section(pod, "metadata").get("namespace")
    return f"{namespace}/{job}" if isinstance(job, str) else None


def _pod_index(pod: Obj) -> list[str]:
    job = _pod_job(pod)
    return [job] if job is not None else []


def _slim_pod(pod: Obj) -> Obj:
    """Only what the gate reads of a pod: which job it belongs to. A training cluster's
    pods are large; their specs and statuses would be most of the cache."""
    meta = objects.section(pod, "metadata")
    job = objects.labels(pod).get(JOBSET_NAME_LABEL)
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": objects.uid(pod),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {JOBSET_NAME_LABEL: job} if isinstance(job, str) else {},
        }
    }


class ReadmissionGate:
    """The gate. ``start``/``stop`` run it in threads; ``run_once`` is one synchronous
    pass (fresh LISTs into the caches, every key decided once, no leader election) for
    tests and one-shot use beside or instead of a running gate (the preconditions keep
    that safe)."""

    def __init__(
        self,
        config: Config,
        api_client: k8s.ApiClient,
        *,
        clock: Callable[[], datetime] = _utc_now,
        registry: CollectorRegistry | None = None,
        identity: str | None = None,
    ) -> None:
        self.config = config
        gate = config.readmission
        self.annotations = Annotations(config.annotation_prefix)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._clock = clock
        self._timeout = config.apiserver_request_timeout.total_seconds()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.queue: WorkQueue[WorkKey] = WorkQueue()
        self.metrics = GateMetrics(registry)
        self.stalls = StallTracker(clock)
        """Workloads free to run that the gate keeps waiting (the "waiting too long" alert)."""
        self._worker_recheck = min(
            gate.interval.total_seconds(), gate.multi_kueue.worker_recheck.total_seconds()
        )
        self.passes = 0
        """Resyncs run (each enqueues every gated Workload)."""
        self.errors = 0
        """Keys whose decision failed other than by a conflict or a vanished object."""
        self.applied: Counter[GateAction] = Counter()
        """Writes applied, by action (for tests and the log)."""
        self.fresh_reads = 0
        """Times a grant was confirmed on fresh reads (a TrainJob GET and a pod LIST)."""
        self.workers = WorkerClusters(
            self._custom,
            self._core,
            kueue_namespace=gate.multi_kueue.kueue_namespace,
            timeout=gate.multi_kueue.worker_timeout.total_seconds(),
            recheck=gate.multi_kueue.worker_recheck.total_seconds(),
        )
        """MultiKueue's worker clusters, counted for jobs MultiKueue dispatches."""

        self.checks = Store()
        self.workloads = Store({"owner": _owner_index, "check": _check_index})
        self.trainjobs = Store()
        self.pods = Store({"job": _pod_index})
        watch_timeout = int(gate.watch_timeout.total_seconds())

        def informer(
            name: str, call: Callable[..., Any], store: Store, handler: Any, **kw: Any
        ) -> Informer:
            return Informer(
                name,
                call,
                store=store,
                handler=handler,
                stop=self._stop,
                request_timeout=self._timeout,
                watch_timeout=watch_timeout,
                on_restart=self._on_restart,
                **kw,
            )

        custom = self._custom
        self.informers = [
            informer(
                "admissionchecks",
                functools.partial(
                    custom.list_cluster_custom_object,
                    ADMISSION_CHECK_GROUP,
                    ADMISSION_CHECK_VERSION,
                    ADMISSION_CHECKS,
                ),
                self.checks,
                self._on_check,
            ),
            informer(
                "workloads",
                functools.partial(
                    custom.list_cluster_custom_object,
                    WORKLOAD.group,
                    WORKLOAD.version,
                    WORKLOAD.plural,
                ),
                self.workloads,
                self._on_workload,
            ),
            informer(
                "trainjobs",
                functools.partial(
                    custom.list_cluster_custom_object,
                    TRAINJOB.group,
                    TRAINJOB.version,
                    TRAINJOB.plural,
                ),
                self.trainjobs,
                self._on_trainjob,
            ),
            informer(
                "pods",
                self._core.list_pod_for_all_namespaces,
                self.pods,
                self._on_pod,
                label_selector=JOBSET_NAME_LABEL,  # exists: only the pods of JobSets
                transform=_slim_pod,
            ),
        ]
        self.elector: LeaseElector | None = None
        if gate.leader_election:
            self.elector = LeaseElector(
                api_client,
                namespace=gate.lease_namespace or pod_namespace(),
                name=gate.lease_name,
                identity=identity,
                timing=ElectionTiming(
                    lease_duration=gate.lease_duration.total_seconds(),
                    renew_deadline=gate.renew_deadline.total_seconds(),
                    retry_period=gate.retry_period.total_seconds(),
                ),
                request_timeout=self._timeout,
                on_started_leading=self._enqueue_all,
                on_stopped_leading=self.stalls.clear,
            )
        self.metrics.track_queue(self.queue.depth)
        self.metrics.track_leader(self.may_write)
        self.metrics.track_stalls(self.stalls)
        for inf in self.informers:
            self.metrics.track_cache(inf.name, inf.store.__len__)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def identity(self) -> str | None:
        return self.elector.identity if self.elector is not None else None

    def may_write(self) -> bool:
        """True while this replica is the leader (always, without leader election) and has
        not been told to stop."""
        return not self._stop.is_set() and (self.elector is None or self.elector.is_leader())

    def synced(self) -> bool:
        """Every cache has been filled by its first LIST."""
        return all(inf.synced.is_set() for inf in self.informers)

    def alive(self) -> bool:
        """Started, and every thread (the worker, each informer's) still running: a liveness
        check that asks nothing of the apiserver. False once stopped."""
        return (
            not self._stop.is_set()
            and bool(self._threads)
            and all(thread.is_alive() for thread in self._threads)
            and all(inf.alive() for inf in self.informers)
        )

    def start(self) -> None:
        for inf in self.informers:
            inf.start()
        worker = threading.Thread(target=self._work, name="readmission-worker", daemon=True)
        worker.start()
        self._threads.append(worker)
        if self.elector is not None:
            self.elector.start()

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop within ``timeout`` in all, even with the apiserver silent.

        From the first line on no write starts (``may_write`` is False), bar one that has
        passed its check already. A third of the time waits for the worker, a third for the
        Lease's release, and the watches share what is left; a thread still in a request
        then ends on its own (they are daemon threads, and each sees the stop).
        """
        started = time.monotonic()

        def left_until(share: float) -> float:
            return max(0.0, started + timeout * share - time.monotonic())

        self._stop.set()
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(left_until(1 / 3))
        if self.elector is not None:
            self.elector.stop(release=release, timeout=left_until(2 / 3))
        for inf in self.informers:
            if not inf.join(left_until(1)):
                log.warning("informer %s did not stop within %.1fs", inf.name, timeout)
        self.workers.close()

    # -- event handlers (informer threads): map a change to the keys it affects -----------

    def _our(self, check: Obj | None) -> bool:
        return (
            check is not None
            and objects.section(check, "spec").get("controllerName")
            == self.config.readmission.controller_name
        )

    def _on_check(self, old: Obj | None, new: Obj | None) -> None:
        if not (self._our(old) or self._our(new)):
            return
        name = objects.name(new if new is not None else old)
        if name is None:
            return
        self.queue.add((_CHECK, name))
        # A check that became ours (or stopped being ours) changes what its Workloads need.
        for workload in self.workloads.by_index("check", name):
            self.queue.add((_WORKLOAD, object_key(workload)))

    def _on_workload(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is not None and (_check_index(obj) or (old is not None and _check_index(old))):
            self.queue.add((_WORKLOAD, object_key(obj)))

    def _enqueue_owned(self, job_key: str | None) -> None:
        if job_key is None:
            return
        for workload in self.workloads.by_index("owner", job_key):
            self.queue.add((_WORKLOAD, object_key(workload)))

    def _on_trainjob(self, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is not None:
            self._enqueue_owned(object_key(obj))

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None and new is not None and _pod_job(old) == _pod_job(new):
            return  # the slimmed pod changed only its resourceVersion: counts are the same
        for pod in (old, new):
            if pod is not None:
                self._enqueue_owned(_pod_job(pod))

    def _on_restart(self, resource: str, reason: str, exc: BaseException | None) -> None:
        self.metrics.watch_restarts.labels(resource, reason).inc()
        if exc is not None:
            self._count_request_error(f"list-watch {resource}", exc)

    def _enqueue_all(self) -> None:
        """Every key of ours: on becoming the leader, and at each resync."""
        gated: set[str] = set()
        for name in self.our_checks():
            self.queue.add((_CHECK, name))
            for workload in self.workloads.by_index("check", name):
                gated.add(object_key(workload))
                self.queue.add((_WORKLOAD, object_key(workload)))
        self.stalls.retain(gated)  # a safety net: no stale entry outlives a resync

    # -- the worker ----------------------------------------------------------------------

    def _work(self) -> None:
        # Deciding on half-filled caches would write misleading messages; wait for all.
        while not self._stop.is_set() and not self.synced():
            self._stop.wait(0.05)
        interval = self.config.readmission.interval.total_seconds()
        next_resync = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_resync:
                self.passes += 1
                self._enqueue_all()
                next_resync = now + interval
            key = self.queue.get(timeout=max(0.01, min(0.5, next_resync - now)))
            if key is None:
                continue
            try:
                self._process(key)
            finally:
                self.queue.done(key)

    def run_once(self) -> list[tuple[WorkKey, str]]:
        """One synchronous pass: fresh LISTs into the caches, then every key of ours decided
        once, acting as the leader. Returns (key, outcome) per key."""
        for inf in self.informers:
            inf.relist()
        self.passes += 1
        keys: list[WorkKey] = []
        for name in sorted(self.our_checks()):
            keys.append((_CHECK, name))
            keys.extend((_WORKLOAD, object_key(w)) for w in self.workloads.by_index("check", name))
        self.stalls.retain(key for kind, key in keys if kind == _WORKLOAD)
        return [(key, self._process(key, as_leader=True)) for key in dict.fromkeys(keys)]

    def _process(self, key: WorkKey, *, as_leader: bool = False) -> str:
        """Decide one key; returns the outcome (a metrics label)."""
        started = time.perf_counter()
        try:
            if not as_leader and not self.may_write():
                outcome = "follower"  # a new leader enqueues everything itself
            elif key[0] == _CHECK:
                outcome = self._reconcile_check(key[1], as_leader)
            else:
                outcome = self._reconcile_workload(key[1], as_leader)
            self.queue.forget(key)
        except k8s.ApiException as exc:
            # Changed (409) or gone (404) under us: the watch brings the news; decide again
            # after a short backoff in case it already has.
            outcome = {409: "conflict", 404: "not-found"}.get(exc.status or 0, "error")
            if outcome == "error":
                self.errors += 1
                log.warning("readmission %s: %s", key, exc)
            self.queue.add_rate_limited(key)
        except Exception:  # one bad key must not end the gate
            outcome = "error"
            self.errors += 1
            log.exception("readmission %s failed", key)
            self.queue.add_rate_limited(key)
        if outcome == "follower" and key[0] == _WORKLOAD:
            self.stalls.forget(key[1])  # the leader counts it
        self.metrics.reconciles.labels(outcome).inc()
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        return outcome

    # -- requests (each bounded, each failure counted) -------------------------------------

    def _count_request_error(self, operation: str, exc: BaseException) -> None:
        code = exc.status if isinstance(exc, k8s.ApiException) else 0
        self.metrics.request_errors.labels(operation, str(code or 0)).inc()

    def _call(self, operation: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return call(*args, _request_timeout=self._timeout, **kwargs)
        except (k8s.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            self._count_request_error(operation, exc)
            raise

    # -- AdmissionChecks -------------------------------------------------------------------

    def our_checks(self) -> frozenset[str]:
        """Names of the AdmissionChecks we serve (from the cache)."""
        return frozenset(
            name
            for check in self.checks.values()
            if self._our(check) and (name := objects.name(check)) is not None
        )

    def _reconcile_check(self, name: str, as_leader: bool) -> str:
        """Keep the check's ``Active`` condition True, observing its current generation."""
        check = self.checks.get(name)
        if check is None or not self._our(check):
            return "nothing"
        generation = objects.generation(check)
        current = objects.condition(check, "Active")
        if (
            current is not None
            and current.get("status") == "True"
            and current.get("observedGeneration") == generation
        ):
            return "nothing"
        updated = json.loads(json.dumps(check))  # a deep copy of JSON
        others = [c for c in objects.conditions(check) if c.get("type") != "Active"]
        still_true = current is not None and current.get("status") == "True"
        condition: dict[str, Any] = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": "holdwarden readmission gate is serving this check",
            # The transition time moves only when the status does (Kubernetes' convention).
            "lastTransitionTime": (
                current.get("lastTransitionTime")
                if still_true and current is not None
                else objects.format_time(self._clock())
            ),
        }
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        updated.setdefault("status", {})["conditions"] = [*others, condition]
        if not as_leader and not self.may_write():
            return "follower"
        self._call(
            "update admissionchecks/status",
            self._custom.replace_cluster_custom_object_status,
            ADMISSION_CHECK_GROUP,
            ADMISSION_CHECK_VERSION,
            ADMISSION_CHECKS,
            name,
            updated,
            field_manager=_FIELD_MANAGER,
        )
        return "keep-active"

    # -- Workloads -------------------------------------------------------------------------

    def _reconcile_workload(self, key: str, as_leader: bool) -> str:
        workload = self.workloads.get(key)
        checks = self.our_checks()
        if workload is None or not checks or not set(_check_index(workload)) & checks:
            self.stalls.forget(key)  # deleted, or no longer gated by us
            return "nothing"
        trainjob = self._cached_trainjob(workload)
        pods = self._cached_pods(trainjob)
        workers: tuple[WorkerCount, ...] | None = None
        fresh = False
        outcome = "nothing"
        for _ in range(_MAX_STEPS):
            decision = decide_readmission(
                workload,
                trainjob,
                pods,
                check_names=checks,
                annotations=self.annotations,
                now=self._clock(),
                workers=workers,
            )
            if decision.action is GateAction.NOTHING:
                self.stalls.record(key, decision.stalled)
                break
            uncounted = workers is None and objects.dispatched_by_multikueue(trainjob)
            if not fresh and (
                uncounted or decision.action in (GateAction.MARK_READY, GateAction.RAISE_ATTEMPT)
            ):
                # The cache may lag behind a pod or an A raised: grant only on fresh reads.
                # A job MultiKueue dispatches ran on a worker cluster: count it there too
                # (no watch cache of the workers; only when a decision is due).
                trainjob = self._read_trainjob(workload)
                pods = self._count_pods(workload, trainjob)
                if objects.dispatched_by_multikueue(trainjob):
                    assert trainjob is not None
                    workers = self.workers.count(
                        trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]
                    )
                    if worker_blocker(workers) is not None:
                        # Nothing on the manager changes when a worker's pods go: look again.
                        self.queue.add_after((_WORKLOAD, key), self._worker_recheck)
                fresh = True
                self.fresh_reads += 1
                continue
            if not as_leader and not self.may_write():
                return "follower"
            workload, trainjob = self._apply(decision, workload, trainjob)
            if outcome == "nothing":
                # The first write names the outcome: a grant is "mark-ready" even though
                # the A it records is raised in the same reconcile.
                outcome = decision.action.value
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
        return outcome

    def _apply(
        self, decision: GateDecision, workload: Obj, trainjob: Obj | None
    ) -> tuple[Obj, Obj | None]:
        """Write what was decided; the objects as written (for the next step)."""
        namespace = workload["metadata"]["namespace"]
        if decision.workload is not None:
            written: Any = self._call(
                "update workloads/status",
                self._custom.replace_namespaced_custom_object_status,
                WORKLOAD.group,
                WORKLOAD.version,
                namespace,
                WORKLOAD.plural,
                workload["metadata"]["name"],
                decision.workload,
                field_manager=_FIELD_MANAGER,
            )
            return dict(written), trainjob
        if decision.trainjob is not None:
            raised: Any = self._call(
                "update trainjobs",
                self._custom.replace_namespaced_custom_object,
                TRAINJOB.group,
                TRAINJOB.version,
                namespace,
                TRAINJOB.plural,
                decision.trainjob["metadata"]["name"],
                decision.trainjob,
                field_manager=_FIELD_MANAGER,
            )
            return workload, dict(raised)
        return workload, trainjob

    def _cached_trainjob(self, workload: Obj) -> Obj | None:
        owner = objects.controller_trainjob(workload)
        if owner is None:
            return None
        found = self.trainjobs.get(f"{workload['metadata']['namespace']}/{owner.name}")
        if found is None or objects.uid(found) != owner.uid:
            return None  # absent, or a new TrainJob of the same name: not this Workload's
        return found

    def _cached_pods(self, trainjob: Obj | None) -> int:
        if trainjob is None:
            return 0
        return self.pods.count_by_index("job", object_key(trainjob))

    def _read_trainjob(self, workload: Obj) -> Obj | None:
        owner = objects.controller_trainjob(workload)
        if owner is None:
            return None
        try:
            found: Any = self._call(
                "get trainjobs",
                self._custom.get_namespaced_custom_object,
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
        if objects.uid(found) != owner.uid:
            return None
        trainjob: Obj = found
        return trainjob

    def _count_pods(self, workload: Obj, trainjob: Obj | None) -> int:
        if trainjob is None:
            return 0
        response: Any = self._call(
            "list pods",
            self._core.list_namespaced_pod,
            workload["metadata"]["namespace"],
            label_selector=f"{JOBSET_NAME_LABEL}={trainjob['metadata']['name']}",
            _preload_content=False,
        )
        try:
            items: Iterable[Any] = json.loads(response.data).get("items") or []
        finally:
            response.release_conn()
        return len(list(items))
