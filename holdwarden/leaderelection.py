"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Why not ``kubernetes.leaderelection``: that module builds its own API client from the
global configuration (so it cannot use ``holdwarden.kubeclient``'s credentials),
sends requests without a timeout, loops forever without a way to stop it, never
releases the Lease, and exits the process on a bad setting. What follows is client-go's
algorithm (``tools/leaderelection``), with those four things done.

The algorithm, and the invariants it gives:

- Every ``retry_period`` a candidate reads the Lease. It takes it when it is absent (create),
  when its holder is empty (released), or when the record has not changed for
  ``lease_duration`` *as measured on this candidate's own monotonic clock* from when it
  first saw that record (so wall-clock skew between machines does not matter). The holder
  renews ``renewTime`` every ``retry_period``. Every write is an update preconditioned on
  the resourceVersion read, so two candidates can never both win one round.
- ``is_leader()`` is true only until ``renew_deadline`` after the start of the last renewal
  that succeeded. Since ``renew_deadline < lease_duration`` and a follower starts counting
  only once it has read the renewed record (after that renewal was sent), the old leader
  stops acting before any follower may take over: at most one leader acts at a time, up to
  the two clocks' drift rates and writes already on the wire (callers precondition their
  writes, so such a write cannot undo a newer decision).
- ``stop()`` releases the Lease when held (holder emptied, duration 1 s), so a follower
  takes over at its next retry instead of after ``lease_duration``. A process that dies
  without releasing is replaced within ``lease_duration + retry_period`` of its last renewal.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

log = logging.getLogger("holdwarden.leaderelection")

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JITTER = 1.2  # client-go's JitterFactor: a follower waits retry_period * [1, 1.2)


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process, readable in the Lease (client-go's form)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


def pod_namespace(fallback: str = "default") -> str:
    """The namespace this process runs in: ``$POD_NAMESPACE``, else the service account's
    namespace file, else ``fallback`` (outside a cluster)."""
    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        text = _SA_NAMESPACE.read_text().strip()
    except OSError:
        text = ""
    return text or fallback


@dataclass(frozen=True)
class ElectionTiming:
    """Seconds. Invariant (checked): lease_duration > renew_deadline > retry_period * 1.2 > 0."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period > 0:
            raise ValueError("retry_period must be longer than zero")
        if not self.renew_deadline > self.retry_period * JITTER:
            raise ValueError("renew_deadline must be longer than 1.2 x retry_period")
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be longer than renew_deadline")


class LeaseElector:
    """Campaigns for one Lease in a thread. Callbacks run on the elector's thread and must
    return quickly (they should only flag or enqueue work)."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        request_timeout: float = 10.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = k8s.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or ElectionTiming()
        # A renewal that has not answered within the renew deadline is no use to anyone.
        self._request_timeout = min(request_timeout, self.timing.renew_deadline)
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        """Monotonic start of the last successful acquire/renew by us (None: not leader)."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._leading = False
        self.transitions = 0
        """Times this elector became leader."""
        self.errors = 0
        """Lease requests that failed other than by losing a race (for metrics)."""

    # ---- what callers ask ---------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this process may act as the leader (see the module doc)."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self._clock() - renewed < self.timing.renew_deadline

    def campaigning(self) -> bool:
        """True while the campaign thread runs (a step on the wire may outlive stop())."""
        return self._thread is not None and self._thread.is_alive()

    def holder(self) -> str | None:
        """The holder last seen in the Lease (None before the first read or when empty)."""
        with self._lock:
            return None if self._observed is None else self._observed[0]

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}")
        self._thread.daemon = True
        self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop campaigning and release the Lease if we hold it, all within ``timeout``.

        Half of it waits for a campaign step on the wire to end; the release's read and
        write share the rest. A step still running after that ends on its own (it is a
        daemon thread and sees the stop), and its write cannot undo the release: both
        carry the resourceVersion they read, so the later one gets a 409.
        """
        deadline = self._clock() + timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout / 2)
        with self._lock:
            self._renewed_at = None
        self._notify(False)
        # Release whenever the Lease last named us, even if our renewals had lapsed: no
        # one else has taken it then, and emptying it saves the followers a full duration.
        if release and self.holder() == self.identity:
            per_request = min(self._request_timeout, (deadline - self._clock()) / 2)
            if per_request > 0:
                self._release(per_request)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:  # the campaign must outlive any error
                self.errors += 1
                log.exception("lease %s/%s: campaign step failed", self.namespace, self.name)
            leading = self.is_leader()
            self._notify(leading)
            period = self.timing.retry_period
            # Followers jitter so that candidates started together do not collide forever.
            self._stop.wait(period if leading else period * random.uniform(1.0, JITTER))

    def _notify(self, leading: bool) -> None:
        # Both the campaign thread and stop() report; each change is reported once.
        with self._lock:
            if leading == self._leading:
                return
            self._leading = leading
        if leading:
            self.transitions += 1
            log.info("lease %s/%s: %s is the leader", self.namespace, self.name, self.identity)
            if self._on_started is not None:
                self._on_started()
        else:
            log.info("lease %s/%s: %s stopped leading", self.namespace, self.name, self.identity)
            if self._on_stopped is not None:
                self._on_stopped()

    # ---- one round ----------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One round of the campaign; True when we hold the Lease after it."""
        started = self._clock()
        now = datetime.now(UTC)
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._request_timeout
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                self.errors += 1
                log.warning("lease %s/%s: read failed: %s", self.namespace, self.name, exc)
                return False
            return self._create(started, now)
        spec = lease.spec or k8s.V1LeaseSpec()
        record = (
            spec.holder_identity or None,
            spec.lease_duration_seconds,
            spec.renew_time,
            spec.acquire_time,
            spec.lease_transitions,
        )
        with self._lock:
            if record != self._observed:
                self._observed = record
                self._observed_at = started
            observed_at = self._observed_at
        holder = record[0]
        ours = holder == self.identity
        if not ours and holder is not None:
            duration = float(spec.lease_duration_seconds or self.timing.lease_duration)
            if started - observed_at < duration:
                return False  # held by someone else, and not yet expired on our clock
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = max(1, round(self.timing.lease_duration))
        spec.renew_time = now
        if not ours:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        lease.spec = spec
        try:
            # replace carries metadata.resourceVersion: a precondition on what we read.
            written = self._api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self._request_timeout
            )
        except k8s.ApiException as exc:
            if exc.status != 409:
                self.errors += 1
                log.warning("lease %s/%s: update failed: %s", self.namespace, self.name, exc)
            return False
        self._won(started, written)
        return True

    def _create(self, started: float, now: datetime) -> bool:
        body = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=k8s.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self.timing.lease_duration)),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            written = self._api.create_namespaced_lease(
                self.namespace, body, _request_timeout=self._request_timeout
            )
        except k8s.ApiException as exc:
            if exc.status != 409:  # 409: another candidate created it first
                self.errors += 1
                log.warning("lease %s/%s: create failed: %s", self.namespace, self.name, exc)
            return False
        self._won(started, written)
        return True

    def _won(self, started: float, lease: Any) -> None:
        spec = lease.spec
        with self._lock:
            # A step that was on the wire when stop() gave up waiting for it must not make
            # us the leader again; the Lease it wrote expires (or stop() empties it).
            if not self._stop.is_set():
                self._renewed_at = started
            self._observed = (
                spec.holder_identity or None,
                spec.lease_duration_seconds,
                spec.renew_time,
                spec.acquire_time,
                spec.lease_transitions,
            )
            self._observed_at = started

    def _release(self, request_timeout: float) -> None:
        """Empty the holder (if it is still us) so a follower takes over at once."""
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=request_timeout
            )
            spec = lease.spec
            if spec is None or spec.holder_identity != self.identity:
                return
            spec.holder_identity = None
            spec.lease_duration_seconds = 1
            spec.renew_time = datetime.now(UTC)
            self._api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=request_timeout
            )
            log.info("lease %s/%s: released by %s", self.namespace, self.name, self.identity)
        except Exception as exc:  # best effort: the lease expires anyway
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
