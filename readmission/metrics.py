"""Prometheus metrics of the readmission gate.

The gate runs in threads, so these are prometheus_client's own (locked) metrics, not the
enforcer's event-loop-only bookkeeping (webhook/metrics.py). They are registered in the
registry given (``holdwarden gate`` passes its process's, served on its own ``/metrics``:
holdwarden/cli/gateserver.py); by default each gate gets a registry of its own, so tests
and several gates in one process never collide.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

QUEUE_DEPTH = "holdwarden_readmission_queue_depth"
RECONCILES = "holdwarden_readmission_reconciles"
DECISION_SECONDS = "holdwarden_readmission_decision_duration_seconds"
LEADER = "holdwarden_readmission_leader"
REQUEST_ERRORS = "holdwarden_readmission_request_errors"
WATCH_RESTARTS = "holdwarden_readmission_watch_restarts"
CACHED_OBJECTS = "holdwarden_readmission_cached_objects"
STALLED = "holdwarden_readmission_stalled_workloads"
LONGEST_STALL = "holdwarden_readmission_longest_stall_seconds"

# A decision from the cache takes microseconds; one that grants re-reads the TrainJob and
# its pods and writes twice (tens of milliseconds on a healthy apiserver).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

OUTCOMES = (
    "nothing",
    "keep-pending",
    "mark-ready",
    "raise-attempt",
    "keep-active",
    "conflict",
    "not-found",
    "follower",
    "error",
)
"""``reconciles`` label ``outcome``: the first action applied for the key (GateAction
values, ``keep-active`` for an AdmissionCheck's condition), or why nothing was applied (a
409, a 404, not the leader, another error)."""


class StallTracker:
    """Which Workloads the gate keeps waiting although they are free to run, and since when.

    A Workload is *stalled* while its check is Pending on a job that is opened, not ended,
    not held and active, and the gate still says no (``GateDecision.stalled``: pods of the
    previous execution remain, a MultiKueue worker has or may have them, A is unreadable).
    Its clock starts at the first decision that found it stalled and runs while every
    decision since did; one that did not (readmitted, held again, gone, not ours) forgets
    it. The metrics are two numbers, never one series per Workload.

    Thread-safe: the worker writes, scrapes read. Only the leader decides, so a follower's
    tracker is cleared (``clear``) and stays empty.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._since: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def record(self, key: str, stalled: bool) -> None:
        """The outcome of one decision about Workload ``key`` (namespace/name)."""
        with self._lock:
            if not stalled:
                self._since.pop(key, None)
            elif key not in self._since:
                self._since[key] = self._clock()

    def forget(self, key: str) -> None:
        with self._lock:
            self._since.pop(key, None)

    def retain(self, keys: Iterable[str]) -> None:
        """Forget every Workload not in ``keys`` (the gated Workloads that still exist)."""
        keep = set(keys)
        with self._lock:
            for key in [k for k in self._since if k not in keep]:
                del self._since[key]

    def clear(self) -> None:
        with self._lock:
            self._since.clear()

    def count(self) -> int:
        with self._lock:
            return len(self._since)

    def longest(self) -> float:
        """Seconds the longest-stalled Workload has been waiting; 0 when none is."""
        with self._lock:
            oldest = min(self._since.values(), default=None)
        if oldest is None:
            return 0.0
        return max(0.0, (self._clock() - oldest).total_seconds())


class GateMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(
            QUEUE_DEPTH, "Workload and AdmissionCheck keys waiting to be decided.", registry=r
        )
        self.reconciles = Counter(
            RECONCILES,
            "Keys decided, by outcome (the action applied, or why none was).",
            ("outcome",),
            registry=r,
        )
        self.decision_seconds = Histogram(
            DECISION_SECONDS,
            "Time to decide one key and apply its writes (from the cache, plus the fresh "
            "reads and writes of a grant).",
            buckets=BUCKETS,
            registry=r,
        )
        self.leader = Gauge(LEADER, "1 while this replica holds the gate's Lease.", registry=r)
        self.request_errors = Counter(
            REQUEST_ERRORS,
            "API requests of the gate that failed, by operation and HTTP status (0: no answer).",
            ("operation", "code"),
            registry=r,
        )
        self.watch_restarts = Counter(
            WATCH_RESTARTS,
            "Relists of an informer, by resource and reason (expired: 410 Gone; error).",
            ("resource", "reason"),
            registry=r,
        )
        self.cached = Gauge(
            CACHED_OBJECTS, "Objects in the gate's cache, by resource.", ("resource",), registry=r
        )
        self.stalled = Gauge(
            STALLED,
            "Workloads free to run (opened, not held, active) that the gate keeps Pending: "
            "pods of the previous execution remain, a MultiKueue worker was not counted, or "
            "the attempt annotation is unreadable. 0 on a follower.",
            registry=r,
        )
        self.longest_stall = Gauge(
            LONGEST_STALL,
            "Seconds the longest-stalled of those Workloads has been kept waiting (since "
            "this replica first found it so; 0 when none is).",
            registry=r,
        )
        for outcome in OUTCOMES:
            self.reconciles.labels(outcome)  # present at zero from the start

    def track_queue(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(depth()))

    def track_cache(self, resource: str, size: Callable[[], int]) -> None:
        self.cached.labels(resource).set_function(lambda: float(size()))

    def track_leader(self, leading: Callable[[], bool]) -> None:
        self.leader.set_function(lambda: 1.0 if leading() else 0.0)

    def track_stalls(self, stalls: StallTracker) -> None:
        self.stalled.set_function(lambda: float(stalls.count()))
        self.longest_stall.set_function(stalls.longest)
