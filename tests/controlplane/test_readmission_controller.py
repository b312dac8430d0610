"""The readmission gate as a controller, on the real control plane: leader failover under
load, the requests it makes when nothing happens, watch expiry, metrics.

Kueue is the actor in tests/support/actors.py (``admission_check=...``: it admits only through the
gate's check); Trainer is the actor that makes and deletes pods.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s
from prometheus_client import generate_latest

from holdwarden.adapter import Adapter, CallMeta, Ref
from holdwarden.adapter.errors import Conflict
from holdwarden.config import Config
from holdwarden.objects import recorded_grant
from holdwarden.readmission.controller import ReadmissionGate
from holdwarden.readmission.decisions import GateAction, granted_attempt
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations
from rig.builders import trainjob_body, workload_body
from rig.localcluster import GATE_IDENTITY, LocalCluster
from tests.controlplane.test_readmission_kube import check_name, failover_gate_config, gate_config
from tests.support.actors import KueueActor, TrainerActor, Watcher, WatchEvent

__all__ = ["check_name"]  # the fixture, re-used

ROOT = Path(__file__).resolve().parents[2]
NOTES = Annotations()
LEASE_NAMESPACE = "default"  # where gate_config puts the Lease


def _eventually(probe: Callable[[], bool], what: str, timeout: float) -> float:
    """Wait (bounded) until ``probe()``; the seconds it took."""
    started = time.monotonic()
    while not probe():
        assert time.monotonic() - started < timeout, f"not within {timeout}s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def _holder(admin: k8s.ApiClient, lease: str) -> str | None:
    try:
        found = k8s.CoordinationV1Api(admin).read_namespaced_lease(lease, LEASE_NAMESPACE)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found.spec.holder_identity if found.spec is not None else None


def _meta(instance: int | None = None) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=20), instance)


# ---- leader failover under load ---------------------------------------------------------


class Supervisor:
    """One thread per job: wait until it runs, hold it, wait until Kueue suspends it,
    release it; again, with the next instance, until stopped. Errors are kept."""

    def __init__(self, adapter: Adapter, custom: k8s.CustomObjectsApi, refs: list[Ref]) -> None:
        self.adapter = adapter
        self.custom = custom
        self.refs = refs
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.cycles: Counter[str] = Counter()
        self._threads = [
            threading.Thread(target=self._run, args=(ref,), daemon=True) for ref in refs
        ]

    def trainjob(self, ref: Ref) -> dict[str, Any]:
        found: Any = self.custom.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, ref.namespace, TRAINJOB.plural, ref.name
        )
        return dict(found)

    def _wait(self, ref: Ref, suspended: bool) -> bool:
        # Generous: the gate may be changing leaders meanwhile (a few seconds).
        deadline = time.monotonic() + 30
        while not self.stop.is_set():
            if self.trainjob(ref)["spec"].get("suspend") is suspended:
                return True
            if time.monotonic() > deadline:
                self.errors.append(f"{ref.name}: suspend never became {suspended}")
                return False
            time.sleep(0.05)
        return False

    def _run(self, ref: Ref) -> None:
        instance = 1
        try:
            while not self.stop.is_set():
                if not self._wait(ref, suspended=False):
                    return
                try:
                    self.adapter.hold(ref, _meta(instance), "failover test")
                except Conflict:
                    continue  # eight conflicts in a row under load: try the hold again
                if not self._wait(ref, suspended=True):
                    return
                for _ in range(5):  # the hold is in force: only its release may follow
                    try:
                        self.adapter.release(ref, _meta(instance))
                        break
                    except Conflict:
                        continue
                else:
                    self.errors.append(f"{ref.name}: release {instance} kept conflicting")
                    return
                self.cycles[ref.name] += 1
                instance += 1
        except Exception as exc:
            self.errors.append(f"{ref.name}: {exc!r}")

    def __enter__(self) -> Supervisor:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=40)


def _grants_and_attempts(
    events: list[WatchEvent], check: str
) -> tuple[dict[str, list[int]], dict[str, list[int]], list[str]]:
    """From every committed state: per TrainJob, the attempts granted by each transition
    of our check into Ready, and the values P/attempt took; and any Ready rewritten."""
    grants: dict[str, list[int]] = {}
    attempts: dict[str, list[int]] = {}
    rewrites: list[str] = []
    last_check: dict[str, dict[str, Any]] = {}
    for event in events:
        meta = event.obj["metadata"]
        if event.kind == "workload" and event.type != "DELETED":
            owner = next(r["name"] for r in meta["ownerReferences"] if r.get("controller"))
            entry = next(
                (c for c in event.obj.get("status", {}).get("admissionChecks", []) or []
                 if c["name"] == check),
                None,
            )  # fmt: skip
            if entry is None:
                continue
            before = last_check.get(meta["uid"])
            last_check[meta["uid"]] = entry
            if entry["state"] != "Ready":
                continue
            if before is not None and before["state"] == "Ready":
                if before.get("message") != entry.get("message"):
                    rewrites.append(f"{owner} rv {event.rv}: {before} -> {entry}")
                continue
            granted = granted_attempt(entry.get("message"))
            assert granted is not None, entry
            grants.setdefault(owner, []).append(granted)
        elif event.kind == "trainjob" and event.type != "DELETED":
            value = int((meta.get("annotations") or {}).get(NOTES.attempt, "0"))
            seen = attempts.setdefault(meta["name"], [0])
            if value != seen[-1]:
                seen.append(value)
    return grants, attempts, rewrites


@pytest.fixture
def leader_process(cluster: LocalCluster, check_name: str, tmp_path: Path) -> Iterator[Any]:
    """Gate A, alone in a process (so it can be SIGKILLed), as the enforcer's identity."""
    log = (tmp_path / "gate-a.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.readmission_gate_process",
            str(cluster.kubeconfig_path),
            GATE_IDENTITY,
            check_name,
            "gate-a",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=15)
        log.close()


def test_leader_killed_under_load_no_double_ready_no_double_attempt(
    cluster: LocalCluster,
    check_name: str,
    leader_process: Any,
    namespace: str,
    admin_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
    trainer_client: k8s.ApiClient,
    job_controller_client: k8s.ApiClient,
    supervisor_client: k8s.ApiClient,
) -> None:
    """Two gates; the leader (a process) is SIGKILLed while jobs are held and released in a
    loop; the follower (in this process) takes over within the lease duration. In every
    committed state: each admission is granted by exactly one transition into Ready, with
    the attempts 1, 2, 3, ... in order, and P/attempt rises by exactly one per grant."""
    config = failover_gate_config(check_name)  # as gate A's process has it
    lease = config.readmission.lease_name
    lease_seconds = config.readmission.lease_duration.total_seconds()
    retry_seconds = config.readmission.retry_period.total_seconds()
    _eventually(lambda: _holder(admin_client, lease) == "gate-a", "gate A leads", timeout=60)

    follower = ReadmissionGate(
        config, cluster.api_client(GATE_IDENTITY), identity="gate-b"
    )  # fmt: skip
    follower.start()
    custom = k8s.CustomObjectsApi(admin_client)
    try:
        _eventually(follower.synced, "gate B's caches fill", timeout=30)
        assert not follower.may_write(), "gate B leads while gate A holds the Lease"
        with (
            Watcher(admin_client, namespace) as watcher,
            KueueActor(kueue_client, namespace, admission_check=check_name) as kueue,
            TrainerActor(
                trainer_client, namespace, delete_delay=0.3, pods_api=job_controller_client
            ),
        ):
            adapter = Adapter(Config(mode="kueue"), supervisor_client)
            refs = []
            for index in range(3):
                body = trainjob_body(f"job-{index}", queue="user-queue", suspend=True)
                body["metadata"]["namespace"] = namespace
                ref = adapter.start(body, _meta())
                adapter.open(ref, _meta())
                refs.append(ref)

            def total_attempts() -> int:
                return sum(
                    int(sup.trainjob(r)["metadata"].get("annotations", {}).get(NOTES.attempt, 0))
                    for r in refs
                )

            with Supervisor(adapter, custom, refs) as sup:
                _eventually(lambda: total_attempts() >= 6, "6 grants by gate A", timeout=90)
                assert follower.applied[GateAction.MARK_READY] == 0, "the follower wrote"
                before_kill = total_attempts()
                leader_process.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                leader_process.wait(timeout=10)
                takeover = _eventually(
                    lambda: follower.may_write(), "gate B takes over", timeout=30
                )
                _eventually(
                    lambda: total_attempts() >= before_kill + 6, "6 grants by gate B", timeout=90
                )
                assert not sup.errors, sup.errors
            assert not sup.errors, sup.errors

            # Let the last grant's A land, and the watch deliver it, before reading every
            # committed state. The last grant is read as the gate reads it: from a Ready
            # check's message or from the gate's condition, which outlives Kueue's reset of
            # the check when a hold lands between the grant and the raise of A (reading only
            # Ready checks let such a job through while its A was still one short).
            def recorded() -> bool:
                for ref in refs:
                    workload = kueue.workload_of(ref.name) or {}
                    checks = workload.get("status", {}).get("admissionChecks") or []
                    entry = next((c for c in checks if c["name"] == check_name), None)
                    ready = entry is not None and entry["state"] == "Ready"
                    seen_grants = (
                        granted_attempt(entry.get("message")) if entry and ready else None,
                        recorded_grant(workload, NOTES),
                    )
                    last = max((g for g in seen_grants if g is not None), default=0)
                    a = sup.trainjob(ref)["metadata"].get("annotations", {}).get(NOTES.attempt)
                    if last != int(a or 0):
                        return False
                return True

            _eventually(recorded, "A recorded for every grant", timeout=30)
            for kind, plural in (("trainjob", TRAINJOB), ("workload", WORKLOAD)):
                listed: Any = custom.list_namespaced_custom_object(
                    plural.group, plural.version, namespace, plural.plural
                )
                latest = max(int(i["metadata"]["resourceVersion"]) for i in listed["items"])
                watcher.wait_until_seen(kind, latest, timeout=30)
            events = watcher.events()
    finally:
        follower.stop(timeout=5)

    grants, attempts, rewrites = _grants_and_attempts(events, check_name)
    assert not rewrites, f"a Ready check was written again: {rewrites}"
    for ref in refs:
        granted = grants.get(ref.name, [])
        assert granted == list(range(1, len(granted) + 1)), f"{ref.name} grants {granted}"
        seen = attempts.get(ref.name, [0])
        assert seen == list(range(0, len(seen))), f"{ref.name}: A took {seen}"
        # A trails the grant by at most the write that follows it, and that one has landed.
        assert seen[-1] == len(granted), f"{ref.name}: A {seen[-1]}, grants {granted}"
    assert follower.applied[GateAction.MARK_READY] > 0
    assert follower.errors == 0
    took = time.monotonic() - killed_at
    print(
        f"\nleader failover: gate B led {takeover:.2f}s after the SIGKILL (lease "
        f"{lease_seconds:.0f}s, retry {retry_seconds:.1f}s); grants per job "
        f"{ {r.name: len(grants.get(r.name, [])) for r in refs} }, "
        f"{sum(len(g) for g in grants.values())} grants in all, {took:.1f}s after the kill; "
        f"gate B: {dict(follower.applied)}, fresh reads {follower.fresh_reads}"
    )
    # Takeover: the lease duration after gate A's last renewal (at most a retry before the
    # kill), plus gate B's retry period with jitter, plus a busy machine's slack.
    assert takeover < lease_seconds + retry_seconds * 1.2 + 3.0, takeover


# ---- requests when nothing happens ------------------------------------------------------


class CountingPool:
    """Counts every HTTP request an API client sends (urllib3's pool manager, wrapped)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.requests.append((method, url))
        return self._inner.request(method, url, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            taken, self.requests = self.requests, []
        return taken


def _classify(method: str, url: str) -> str:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "/leases" in parts.path:
        return "lease"
    if [v.lower() for v in query.get("watch", [])] in (["true"], ["1"]):
        return "watch"
    if method != "GET":
        return "write"
    segments = parts.path.rstrip("/").split("/")
    # /apis/G/V/R, /apis/G/V/namespaces/NS/R, /api/v1/pods: collections; else one object.
    collection = len(segments) in (4, 6) if parts.path.startswith("/api/") else (
        len(segments) in (5, 7)
    )  # fmt: skip
    return "list" if collection else "get"


def test_a_quiet_cluster_costs_no_lists_only_the_lease(
    cluster: LocalCluster,
    check_name: str,
    namespace: str,
    admin_client: k8s.ApiClient,
    kueue_client: k8s.ApiClient,
) -> None:
    """Three gated Workloads waiting (not opened). Once the gate has said why they wait,
    a quiet period costs no LIST and no write: only the Lease's renewals (and the watches
    already open). The polling gate listed every Workload every second."""
    custom_admin = k8s.CustomObjectsApi(admin_client)
    custom_kueue = k8s.CustomObjectsApi(kueue_client)
    for index in range(3):
        created: Any = custom_admin.create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
            trainjob_body(f"job-{index}", queue="user-queue"),
        )  # fmt: skip
        workload = workload_body(f"wl-{index}", trainjob=created)
        written: Any = custom_kueue.create_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, workload
        )
        written["status"] = {
            "admissionChecks": [
                {"name": check_name, "state": "Pending", "message": "",
                 "lastTransitionTime": "2026-12-02T12:00:00Z"}
            ]
        }  # fmt: skip
        custom_kueue.replace_namespaced_custom_object_status(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, f"wl-{index}", written
        )

    api = cluster.api_client(GATE_IDENTITY)
    pool = CountingPool(api.rest_client.pool_manager)
    api.rest_client.pool_manager = pool  # type: ignore[assignment]  # a counting proxy
    # A resync every 100 ms: re-deciding from the cache must cost no request either.
    gate = ReadmissionGate(gate_config(check_name), api, identity="counted")
    gate.start()

    def waiting() -> bool:
        for index in range(3):
            found: Any = custom_admin.get_namespaced_custom_object(
                WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, f"wl-{index}"
            )
            entry = found["status"]["admissionChecks"][0]
            if "has not been opened" not in entry.get("message", ""):
                return False
        return True

    quiet = 6.0
    try:
        _eventually(lambda: gate.may_write() and waiting(), "the gate says why", timeout=30)
        _eventually(gate.queue.idle, "the queue drains", timeout=10)
        pool.take()
        passes = gate.passes
        time.sleep(quiet)
        requests = pool.take()
        passes = gate.passes - passes
    finally:
        gate.stop(timeout=5)
    kinds = Counter(_classify(m, u) for m, u in requests)
    per_minute = {k: round(v * 60 / quiet) for k, v in sorted(kinds.items())}
    # The polling gate, per pass (every readmission.interval): LIST AdmissionChecks, LIST
    # Workloads, and per gated Workload a TrainJob GET and a pod LIST.
    polling = (2 + 2 * 3) * 60
    print(
        f"\nquiet {quiet:.0f}s, {passes} resyncs: requests {dict(kinds)} "
        f"(per minute {per_minute}); the polling gate at its 1s default: {polling}/min"
    )
    assert passes >= 10, "the resync did not run"
    assert kinds["list"] == 0, requests
    assert kinds["get"] == 0, requests
    assert kinds["write"] == 0, requests
    # The four watches were opened before the quiet period; at most a reconnect each.
    assert kinds["watch"] <= 4, requests
    # The leader renews every retry period: a read and an update.
    renewals = quiet / gate_config(check_name).readmission.retry_period.total_seconds()
    assert kinds["lease"] <= 2 * renewals + 4, requests


# ---- watch expiry, observedGeneration, metrics ------------------------------------------


def test_an_expired_watch_relists_and_the_check_observes_its_generation(
    cluster: LocalCluster, check_name: str, admin_client: k8s.ApiClient
) -> None:
    gate = ReadmissionGate(gate_config(check_name), cluster.api_client(GATE_IDENTITY))
    informer = next(i for i in gate.informers if i.name == "admissionchecks")
    informer.relist()
    assert gate.checks.get(check_name) is not None
    # A resourceVersion long gone from the apiserver's watch window: 410, so relist.
    informer.resource_version = "1"
    assert informer._watch_once() is False
    assert informer.stats.expired == 1

    gate.run_once()
    served: Any = k8s.CustomObjectsApi(admin_client).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "admissionchecks", check_name
    )
    active = next(c for c in served["status"]["conditions"] if c["type"] == "Active")
    assert active["status"] == "True"
    assert active["observedGeneration"] == served["metadata"]["generation"]

    exposition = generate_latest(gate.metrics.registry).decode()
    for name in (
        "holdwarden_readmission_queue_depth",
        'holdwarden_readmission_reconciles_total{outcome="keep-active"} 1.0',
        "holdwarden_readmission_decision_duration_seconds_bucket",
        "holdwarden_readmission_leader 0.0",  # run_once needs no Lease; none was won
        "holdwarden_readmission_watch_restarts_total"
        '{reason="expired",resource="admissionchecks"} 1.0',
        "holdwarden_readmission_cached_objects",
    ):
        assert name in exposition, name
