"""Benchmark of the adapter against its own local control plane (a script, not a test).

Run: ``.venv/bin/python bench/adapter_bench.py [-n 200] [--storm-calls 100]``

Prints, for Kueue mode and plain mode:
- API requests per call, counted at the HTTP layer (a wrapper around the client's urllib3
  PoolManager, so it sees what goes on the wire, not what the adapter thinks it sent),
  next to the adapter's own ``request_count``; Hold should be 2 in steady state;
- median and p99 latency of Hold and Release (N each, one TrainJob, instance rising);
- the same client's bare GET+PUT pair (the floor any preconditioned update pays), and the
  ratio of Hold's median to it;
- a conflict storm: a status writer at 20 Hz on the held object while Hold and Release run;
  success rate, the retries used (409s seen at the HTTP layer) and their distribution.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from kubernetes import client as k8s

from adapter import Adapter, CallMeta, Config, Ref
from adapter.errors import AdapterError
from adapter.kube import MAX_RETRIES
from holdwarden.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from holdwarden.vocabulary import JOB_UID_LABEL, QUEUE_NAME_LABEL, TRAINJOB, WORKLOAD, Resource

Obj = dict[str, Any]
STORM_HZ = 20.0


class CountingPool:
    """Wraps a urllib3 PoolManager and records every request (method, path, status)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.log: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        response = self._inner.request(method, url, *args, **kwargs)
        path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        with self._lock:
            self.log.append((method, path, int(response.status)))
        return response

    def mark(self) -> int:
        with self._lock:
            return len(self.log)

    def since(self, mark: int) -> list[tuple[str, str, int]]:
        with self._lock:
            return self.log[mark:]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@dataclass
class CallStats:
    latencies: list[float] = field(default_factory=list)
    http: Counter[int] = field(default_factory=Counter)  # requests per call -> calls
    shape: Counter[str] = field(default_factory=Counter)  # "GET workloads + PUT workloads"
    own_count: Counter[int] = field(default_factory=Counter)
    conflicts: Counter[int] = field(default_factory=Counter)  # 409s per call -> calls
    errors: Counter[str] = field(default_factory=Counter)

    def line(self, name: str) -> str:
        lat = self.latencies
        return (
            f"  {name:<8} n={len(lat):<4} median {ms(statistics.median(lat))}"
            f"  p99 {ms(pct(lat, 0.99))}  max {ms(max(lat))}"
        )


def _resource(path: str) -> str:
    """``.../namespaces/<ns>/<resource>[/<name>]`` -> ``<resource>`` (list or item)."""
    parts = path.split("/")
    if "namespaces" in parts and parts.index("namespaces") + 2 < len(parts):
        index = parts.index("namespaces") + 2
        return parts[index] + ("" if index + 1 < len(parts) else " (list)")
    return path


def _shape(entries: list[tuple[str, str, int]]) -> str:
    return " + ".join(f"{m} {_resource(p)}" for m, p, _ in entries)


class Bench:
    def __init__(self, cluster: LocalCluster, mode: str) -> None:
        self.cluster = cluster
        self.mode = mode
        self.namespace = cluster.create_namespace(f"bench-{mode}")
        self.api = cluster.api_client(SUPERVISOR_IDENTITY)
        self.adapter = Adapter(Config(mode=mode), self.api)  # type: ignore[arg-type]
        # The adapter sends through its own client (a copy of self.api's configuration).
        rest: Any = self.adapter.api_client.rest_client
        self.pool = CountingPool(rest.pool_manager)
        rest.pool_manager = self.pool
        self.admin = cluster.api_client()
        self.custom: Any = k8s.CustomObjectsApi(self.admin)
        self.instance = 0

    def close(self) -> None:
        self.adapter.close()
        self.api.close()  # type: ignore[no-untyped-call]
        self.admin.close()  # type: ignore[no-untyped-call]

    def meta(self, instance: int | None = None) -> CallMeta:
        return CallMeta(deadline=datetime.now(UTC) + timedelta(seconds=30), instance=instance)

    def make_job(self, name: str) -> Ref:
        """A TrainJob that has run (opened); in Kueue mode with its Workload, as Kueue makes
        it (no Kueue runs here: nothing else writes during the latency runs)."""
        body: Obj = {
            "apiVersion": TRAINJOB.api_version,
            "kind": TRAINJOB.kind,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"runtimeRef": {"name": "torch-distributed"}},
        }
        if self.mode == "kueue":
            body["metadata"]["labels"] = {QUEUE_NAME_LABEL: "user-queue"}
            body["spec"]["suspend"] = True
            tj = self.custom.create_namespaced_custom_object(*self.coords(TRAINJOB), body)
            uid = tj["metadata"]["uid"]
            self.custom.create_namespaced_custom_object(
                *self.coords(WORKLOAD),
                {
                    "apiVersion": WORKLOAD.api_version,
                    "kind": WORKLOAD.kind,
                    "metadata": {
                        "name": f"trainjob-{name}-bench",
                        "labels": {JOB_UID_LABEL: uid},
                        "ownerReferences": [
                            {
                                "apiVersion": TRAINJOB.api_version,
                                "kind": TRAINJOB.kind,
                                "name": name,
                                "uid": uid,
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {
                        "queueName": "user-queue",
                        "podSets": [
                            {
                                "name": "node",
                                "count": 1,
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "n", "image": "busybox"}],
                                    }
                                },
                            }
                        ],
                    },
                },
            )
        else:
            self.adapter.start(body, self.meta())
        ref = Ref(self.namespace, name)
        self.adapter.open(ref, self.meta())
        return ref

    def coords(self, res: Resource) -> tuple[str, str, str, str]:
        return (res.group, res.version, self.namespace, res.plural)

    def held_name(self, ref: Ref) -> tuple[Resource, str]:
        if self.mode == "kueue":
            return WORKLOAD, f"trainjob-{ref.name}-bench"
        return TRAINJOB, ref.name

    def timed(self, stats: CallStats, fn: Callable[[], None]) -> None:
        mark = self.pool.mark()
        own = self.adapter.request_count
        began = time.perf_counter()
        try:
            fn()
        except AdapterError as exc:
            stats.errors[type(exc).__name__] += 1
        stats.latencies.append(time.perf_counter() - began)
        sent = self.pool.since(mark)
        stats.http[len(sent)] += 1
        stats.shape[_shape(sent)] += 1
        stats.own_count[self.adapter.request_count - own] += 1
        stats.conflicts[sum(1 for _, _, status in sent if status == 409)] += 1

    def cycle(self, ref: Ref, n: int, hold: CallStats, release: CallStats) -> int:
        """n rounds of Hold(i) then Release(i); a Release whose Hold failed is not sent (it
        could only be StaleHold). Returns how many Releases were skipped so."""
        skipped = 0
        for _ in range(n):
            self.instance += 1
            inst = self.instance
            failed = sum(hold.errors.values())
            self.timed(hold, partial(self.adapter.hold, ref, self.meta(inst), "bench"))
            if sum(hold.errors.values()) > failed:
                skipped += 1
                continue
            self.timed(release, partial(self.adapter.release, ref, self.meta(inst)))
        return skipped

    def bare_pair(self, ref: Ref, n: int) -> list[float]:
        """GET + preconditioned PUT of the held object with the same client, no adapter."""
        res, name = self.held_name(ref)
        custom: Any = k8s.CustomObjectsApi(self.api)
        out = []
        for i in range(n):
            began = time.perf_counter()
            obj = custom.get_namespaced_custom_object(*self.coords(res), name)
            obj["metadata"].setdefault("annotations", {})["bench/bare"] = str(i)
            custom.replace_namespaced_custom_object(*self.coords(res), name, obj)
            out.append(time.perf_counter() - began)
        return out


class StatusStorm:
    """Writes the held object's status at ``hz`` (merge patches: they never conflict
    themselves, and each one moves resourceVersion under the adapter)."""

    def __init__(self, cluster: LocalCluster, res: Resource, namespace: str, name: str) -> None:
        self.api = cluster.api_client()
        self.custom: Any = k8s.CustomObjectsApi(self.api)
        self.args = (res.group, res.version, namespace, res.plural, name)
        self.stop_event = threading.Event()
        self.writes = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        period = 1.0 / STORM_HZ
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            cond = {
                "type": "BenchStorm",
                "status": "True",
                "reason": "Storm",
                "message": f"write {self.writes}",
                "lastTransitionTime": now,
            }
            try:
                self.custom.patch_namespaced_custom_object_status(
                    *self.args, {"status": {"conditions": [cond]}}
                )
                self.writes += 1
            except k8s.ApiException as exc:
                self.errors.append(f"{exc.status}: {exc.reason}")
            next_at += period
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> StatusStorm:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)
        self.elapsed = time.monotonic() - self.started
        self.api.close()  # type: ignore[no-untyped-call]


def describe_counts(stats: CallStats) -> str:
    http = ", ".join(f"{k} req x{v}" for k, v in sorted(stats.http.items()))
    own = ", ".join(f"{k} x{v}" for k, v in sorted(stats.own_count.items()))
    shape = stats.shape.most_common(1)[0][0] if stats.shape else "-"
    return f"HTTP: {http} (typical: {shape}); adapter's own count: {own}"


def run_mode(cluster: LocalCluster, mode: str, n: int, storm_calls: int) -> None:
    bench = Bench(cluster, mode)
    try:
        ref = bench.make_job("latency")
        hold, release = CallStats(), CallStats()
        bench.cycle(ref, 5, CallStats(), CallStats())  # warm-up: preflight, Workload cache
        bench.cycle(ref, n, hold, release)
        bare = bench.bare_pair(ref, n)
        print(f"\n== {mode} mode (steady state, no other writer), N={n} each")
        print(f"  Hold    {describe_counts(hold)}")
        print(f"  Release {describe_counts(release)}")
        print(hold.line("Hold"))
        print(release.line("Release"))
        print(
            f"  bare GET+PUT (same client) n={len(bare)} median {ms(statistics.median(bare))}"
            f"  p99 {ms(pct(bare, 0.99))}"
        )
        ratio = statistics.median(hold.latencies) / statistics.median(bare)
        ratio_r = statistics.median(release.latencies) / statistics.median(bare)
        print(f"  Hold median / bare pair median = {ratio:.2f}; Release / bare = {ratio_r:.2f}")
        if hold.errors or release.errors:
            print(f"  errors: hold {dict(hold.errors)} release {dict(release.errors)}")

        storm_ref = bench.make_job("storm")
        bench.cycle(storm_ref, 2, CallStats(), CallStats())
        res, name = bench.held_name(storm_ref)
        s_hold, s_release = CallStats(), CallStats()
        with StatusStorm(cluster, res, bench.namespace, name) as storm:
            skipped = bench.cycle(storm_ref, storm_calls, s_hold, s_release)
        calls = len(s_hold.latencies) + len(s_release.latencies)
        failed = sum(s_hold.errors.values()) + sum(s_release.errors.values())
        conflicts = s_hold.conflicts + s_release.conflicts
        retries = sum(k * v for k, v in conflicts.items())
        tries = retries + calls - conflicts[1 + MAX_RETRIES]
        print(
            f"\n== {mode} mode, conflict storm: status writer at {STORM_HZ:.0f} Hz on the"
            f" held {res.kind} ({storm.writes} writes in {storm.elapsed:.1f}s ="
            f" {storm.writes / storm.elapsed:.1f}/s)"
        )
        print(
            f"  {calls} calls, {calls - failed} succeeded"
            f" ({100.0 * (calls - failed) / calls:.1f}%); retries used (409s) {retries} total;"
            f" {100.0 * retries / tries:.0f}% of tries met a 409;"
            f" {skipped} Release(s) not sent because their Hold failed"
        )
        for label, stats in (("Hold", s_hold), ("Release", s_release)):
            dist = ", ".join(f"{k} retries x{v}" for k, v in sorted(stats.conflicts.items()))
            print(f"  {label:<8} {dist}; errors {dict(stats.errors) or 'none'}")
            print(stats.line(label))
        if storm.errors:
            print(f"  storm writer errors: {storm.errors[:3]}")
    finally:
        bench.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="Hold and Release calls each")
    parser.add_argument("--storm-calls", type=int, default=100, help="cycles under the storm")
    parser.add_argument("--modes", default="kueue,plain")
    args = parser.parse_args()
    began = time.monotonic()
    with LocalCluster() as cluster:
        print(f"local control plane up in {cluster.startup_seconds:.1f}s ({cluster.server_url})")
        for mode in args.modes.split(","):
            run_mode(cluster, mode, args.n, args.storm_calls)
    print(f"\ntotal {time.monotonic() - began:.0f}s")


if __name__ == "__main__":
    main()
