"""Benchmark of the adapter against its own local control plane (a script, not a test).

Run: ``.venv/bin/python bench/adapter_bench.py [-n 200] [--storm-calls 100] [--contention]``

``--contention`` runs everything twice, quiet and with both cores loaded by two busy loops
at the same priority (a busy node), and adds, per mode and phase: the read-to-write gap
(p50/p99: from the answer of the call's last GET to the sending of its write, measured on
the wire), success under a status writer at 20 Hz and at 50 Hz, and the write's payload
next to the PUT of the whole object it replaced.

Prints, for Kueue mode and plain mode:
- API requests per call, counted at the HTTP layer (a wrapper around the client's urllib3
  PoolManager, so it sees what goes on the wire, not what the adapter thinks it sent),
  next to the adapter's own ``request_count``; in steady state a Kueue-mode Hold is 3 (the
  TrainJob's and the Workload's GET at once, then the PATCH), a plain-mode Hold 2;
- median and p99 latency of Hold and Release (N each, one TrainJob, instance rising);
- the same client's bare GET+PUT pair (the floor any preconditioned update pays; every PUT
  changes the object, so each commits as a Hold does), measured side by side with the calls
  (rounds whose order turns), and the ratio of Hold's median to it;
- the same Hold/Release rounds with the ``AsyncAdapter`` (one event loop, aiohttp), in the
  same side-by-side rounds: median, p99, and its ratio to the bare pair and to the sync
  adapter's Hold;
- a conflict storm: a status writer at 20 Hz on the held object while Hold and Release run;
  success rate, the retries used (409s seen at the HTTP layer) and their distribution.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from kubernetes import client as k8s

from holdwarden.adapter import Adapter, AsyncAdapter, CallMeta, Config, Ref
from holdwarden.adapter.errors import AdapterError
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Resource
from rig.builders import kueue_workload_body, trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster

Obj = dict[str, Any]
STORM_HZ = 20.0
WRITES = ("PUT", "PATCH")


@dataclass(frozen=True)
class Sent:
    """One request on the wire: when it was handed to urllib3 and when its answer came."""

    method: str
    path: str
    status: int
    began: float
    answered: float
    body_bytes: int


class CountingPool:
    """Wraps a urllib3 PoolManager and records every request (method, path, status, times,
    body size). ``answered`` is when the response headers arrived; reading the (small) body
    and everything the adapter does until its next request counts as gap."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.log: list[Sent] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("body")
        began = time.perf_counter()
        response = self._inner.request(method, url, *args, **kwargs)
        answered = time.perf_counter()
        path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        size = len(body) if isinstance(body, (str, bytes)) else 0
        with self._lock:
            self.log.append(Sent(method, path, int(response.status), began, answered, size))
        return response

    def mark(self) -> int:
        with self._lock:
            return len(self.log)

    def since(self, mark: int) -> list[Sent]:
        with self._lock:
            return self.log[mark:]


def gaps(sent: list[Sent]) -> list[float]:
    """For each write, the time from the answer of the GET just before it to its sending."""
    out = []
    for before, write in itertools.pairwise(sent):
        if write.method in WRITES and before.method == "GET":
            out.append(write.began - before.answered)
    return out


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
    gaps: list[float] = field(default_factory=list)
    write_bytes: list[int] = field(default_factory=list)

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


def _shape(entries: list[Sent]) -> str:
    return " + ".join(f"{s.method} {_resource(s.path)}" for s in entries)


@dataclass
class SideBySide:
    """What the side-by-side rounds measured besides the sync calls' ``CallStats``."""

    bare: list[float] = field(default_factory=list)
    async_holds: list[float] = field(default_factory=list)
    async_releases: list[float] = field(default_factory=list)
    async_errors: int = 0


class Bench:
    def __init__(self, cluster: LocalCluster, mode: str, tag: str = "") -> None:
        self.cluster = cluster
        self.mode = mode
        self.namespace = cluster.create_namespace(f"bench-{mode}{tag}")
        self.api = cluster.api_client(SUPERVISOR_IDENTITY)
        self.adapter = Adapter(Config(mode=mode), self.api)  # type: ignore[arg-type]
        # The adapter sends through its own client (a copy of self.api's configuration).
        rest: Any = self.adapter.api_client.rest_client
        self.pool = CountingPool(rest.pool_manager)
        rest.pool_manager = self.pool
        self.admin = cluster.api_client()
        self.custom: Any = k8s.CustomObjectsApi(self.admin)
        self.instance = 0
        # Each Kueue-mode job's Workload, under the name Kueue gives it (make_job).
        self.workload_names: dict[Ref, str] = {}
        self.bare_writes = itertools.count(1)

    def close(self) -> None:
        self.adapter.close()
        self.api.close()  # type: ignore[no-untyped-call]
        self.admin.close()  # type: ignore[no-untyped-call]

    def meta(self, instance: int | None = None) -> CallMeta:
        return CallMeta(deadline=datetime.now(UTC) + timedelta(seconds=30), instance=instance)

    def make_job(self, name: str) -> Ref:
        """A TrainJob that has run (opened); in Kueue mode with its Workload, as Kueue makes
        it (no Kueue runs here: nothing else writes during the latency runs)."""
        kueue = self.mode == "kueue"
        body: Obj = trainjob_body(
            name,
            namespace=self.namespace,
            queue="user-queue" if kueue else None,
            suspend=True if kueue else None,
        )
        if kueue:
            tj = self.custom.create_namespaced_custom_object(*self.coords(TRAINJOB), body)
            workload = kueue_workload_body(tj, queue="user-queue")
            self.custom.create_namespaced_custom_object(*self.coords(WORKLOAD), workload)
            self.workload_names[Ref(self.namespace, name)] = workload["metadata"]["name"]
        else:
            self.adapter.start(body, self.meta())
        ref = Ref(self.namespace, name)
        self.adapter.open(ref, self.meta())
        return ref

    def coords(self, res: Resource) -> tuple[str, str, str, str]:
        return (res.group, res.version, self.namespace, res.plural)

    def held_name(self, ref: Ref) -> tuple[Resource, str]:
        if self.mode == "kueue":
            return WORKLOAD, self.workload_names[ref]
        return TRAINJOB, ref.name

    def timed(self, stats: CallStats, fn: Callable[[], object]) -> None:
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
        stats.conflicts[sum(1 for s in sent if s.status == 409)] += 1
        stats.gaps.extend(gaps(sent))
        stats.write_bytes.extend(s.body_bytes for s in sent if s.method in WRITES)

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

    def side_by_side(self, ref: Ref, n: int, hold: CallStats, release: CallStats) -> SideBySide:
        """n rounds, each one sync Hold/Release cycle, one ``AsyncAdapter`` cycle (same
        identity, its own aiohttp connections) and one bare pair, the three in an order that
        turns every round, so each takes each place equally often. The baseline is measured
        beside both adapters, not before or after them, so drift on a noisy machine (a
        background task, the API server's caches warming) lands on all three alike. The
        rounds run on one event loop; the sync calls block it, which nothing else needs."""
        out = SideBySide()

        async def run() -> None:
            config = Config(mode=self.mode)  # type: ignore[arg-type]
            async with AsyncAdapter(config, self.api) as adapter:
                for _ in range(2):  # warm-up: its connections, its Workload cache
                    await self.async_cycle(adapter, ref, SideBySide())
                kinds = ["sync", "async", "bare"]
                for i in range(n):
                    for kind in kinds[i % 3 :] + kinds[: i % 3]:
                        if kind == "sync":
                            self.cycle(ref, 1, hold, release)
                        elif kind == "async":
                            await self.async_cycle(adapter, ref, out)
                        else:
                            out.bare.extend(self.bare_pair(ref, 1))

        asyncio.run(run())
        return out

    async def async_cycle(self, adapter: AsyncAdapter, ref: Ref, out: SideBySide) -> None:
        """One Hold(i) then Release(i) with ``adapter``: latencies and failures into ``out``."""
        self.instance += 1
        inst = self.instance
        calls: tuple[tuple[list[float], Awaitable[object]], ...] = (
            (out.async_holds, adapter.hold(ref, self.meta(inst), "bench")),
            (out.async_releases, adapter.release(ref, self.meta(inst))),
        )
        for latencies, call in calls:
            began = time.perf_counter()
            try:
                await call
            except AdapterError:
                out.async_errors += 1
            latencies.append(time.perf_counter() - began)

    def bare_pair(self, ref: Ref, n: int) -> list[float]:
        """GET + preconditioned PUT of the held object with the same client, no adapter.

        Every PUT changes the object (a counter that never repeats), so each one commits a
        new resourceVersion to etcd as a Hold does. An unchanged PUT is a no-op the API
        server answers without writing to etcd, and a baseline made of those is about
        1.4 ms too cheap here. A PUT that did not move the resourceVersion stops the run."""
        res, name = self.held_name(ref)
        custom: Any = k8s.CustomObjectsApi(self.api)
        out = []
        for _ in range(n):
            value = str(next(self.bare_writes))
            began = time.perf_counter()
            obj = custom.get_namespaced_custom_object(*self.coords(res), name)
            obj["metadata"].setdefault("annotations", {})["bench/bare"] = value
            written = custom.replace_namespaced_custom_object(*self.coords(res), name, obj)
            out.append(time.perf_counter() - began)
            if written["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]:
                raise SystemExit(f"bare PUT of {name} wrote nothing (a no-op): bad baseline")
        return out


def _storm_writer(
    kubeconfig: str,
    coords: tuple[str, str, str, str, str],
    hz: float,
    stop: Any,
    writes: Any,
    errors: Any,
) -> None:
    """The storm's process: merge-patch the object's status every 1/hz seconds."""
    from holdwarden import kubeclient

    api = kubeclient.api_client(kubeconfig)
    custom: Any = k8s.CustomObjectsApi(api)
    period = 1.0 / hz
    next_at = time.monotonic()
    while not stop.is_set():
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": "BenchStorm",
            "status": "True",
            "reason": "Storm",
            "message": f"write {writes.value}",
            "lastTransitionTime": now,
        }
        try:
            custom.patch_namespaced_custom_object_status(
                *coords, {"status": {"conditions": [cond]}}
            )
            writes.value += 1
        except k8s.ApiException:
            errors.value += 1
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))
    api.close()  # type: ignore[no-untyped-call]


class StatusStorm:
    """Writes the held object's status at ``hz`` (merge patches: they never conflict
    themselves, and each one moves resourceVersion under the adapter).

    It runs in a process of its own, as a real status writer (Kueue's or Trainer's
    controller) does: in the bench's process it would compete with the adapter for the
    GIL, and a thread waiting for the GIL (up to its 5 ms switch interval) stretches the
    read-to-write window in a way no supervisor beside a real controller sees.
    """

    def __init__(
        self, cluster: LocalCluster, res: Resource, namespace: str, name: str, hz: float
    ) -> None:
        self.hz = hz
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._writes = context.Value("i", 0)
        self._errors = context.Value("i", 0)
        coords = (res.group, res.version, namespace, res.plural, name)
        self.process = context.Process(
            target=_storm_writer,
            args=(str(cluster.kubeconfig_path), coords, hz, self._stop, self._writes, self._errors),
            daemon=True,
        )
        self.errors: list[str] = []
        self.writes = 0

    def __enter__(self) -> StatusStorm:
        self.process.start()
        # Wait for its first write, so the calls run under the storm from the start.
        deadline = time.monotonic() + 30
        while self._writes.value == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.started = time.monotonic()
        self._first = self._writes.value
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.started
        self.writes = self._writes.value - self._first
        self._stop.set()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        if self._errors.value:
            self.errors.append(f"{self._errors.value} status writes failed")


def describe_counts(stats: CallStats) -> str:
    http = ", ".join(f"{k} req x{v}" for k, v in sorted(stats.http.items()))
    own = ", ".join(f"{k} x{v}" for k, v in sorted(stats.own_count.items()))
    shape = stats.shape.most_common(1)[0][0] if stats.shape else "-"
    return f"HTTP: {http} (typical: {shape}); adapter's own count: {own}"


def storm_run(
    cluster: LocalCluster, bench: Bench, ref: Ref, hz: float, calls: int
) -> tuple[float, str]:
    """Hold/Release cycles under a status writer at ``hz``: (success %, one-line summary)."""
    res, name = bench.held_name(ref)
    s_hold, s_release = CallStats(), CallStats()
    with StatusStorm(cluster, res, bench.namespace, name, hz) as storm:
        skipped = bench.cycle(ref, calls, s_hold, s_release)
    # A Release not sent because its Hold failed counts as failed too.
    total = len(s_hold.latencies) + len(s_release.latencies) + skipped
    failed = sum(s_hold.errors.values()) + sum(s_release.errors.values()) + skipped
    conflicts = s_hold.conflicts + s_release.conflicts
    retries = sum(k * v for k, v in conflicts.items())
    rate = 100.0 * (total - failed) / total
    errors = (
        f"Hold {dict(s_hold.errors) or 'none'}, Release {dict(s_release.errors) or 'none'}"
        if s_hold.errors or s_release.errors
        else "none"
    )
    line = (
        f"{hz:.0f} Hz ({storm.writes / storm.elapsed:.1f} writes/s): {total - failed}/{total}"
        f" calls succeeded ({rate:.1f}%), 409s {retries}, errors {errors};"
        f" Hold median {ms(statistics.median(s_hold.latencies))}"
    )
    if storm.errors:
        line += f"; storm errors {storm.errors[:2]}"
    return rate, line


def run_mode(cluster: LocalCluster, mode: str, n: int, storm_calls: int, phase: str) -> Obj:
    """One mode, one phase (quiet or contended): latency, gap, storms; returns a summary."""
    bench = Bench(cluster, mode, "" if phase == "quiet" else "-contended")
    summary: Obj = {"mode": mode, "phase": phase}
    try:
        ref = bench.make_job("latency")
        hold, release = CallStats(), CallStats()
        bench.cycle(ref, 5, CallStats(), CallStats())  # warm-up: preflight, Workload cache
        rounds = bench.side_by_side(ref, n, hold, release)
        bare = rounds.bare
        res, name = bench.held_name(ref)
        whole = len(json.dumps(bench.custom.get_namespaced_custom_object(*bench.coords(res), name)))
        print(f"\n== {mode} mode, {phase}: steady state, no other writer, N={n} each")
        print(f"  Hold    {describe_counts(hold)}")
        print(f"  Release {describe_counts(release)}")
        print(hold.line("Hold"))
        print(release.line("Release"))
        all_gaps = hold.gaps + release.gaps
        print(
            f"  gap read->write: p50 {ms(statistics.median(all_gaps))}"
            f"  p99 {ms(pct(all_gaps, 0.99))} (n={len(all_gaps)})"
        )
        print(
            f"  write payload: Hold {statistics.median(hold.write_bytes):.0f} B, Release"
            f" {statistics.median(release.write_bytes):.0f} B; a PUT of the whole object"
            f" {whole} B"
        )
        print(
            f"  bare GET+PUT (same client) n={len(bare)} median {ms(statistics.median(bare))}"
            f"  p99 {ms(pct(bare, 0.99))}"
        )
        ratio = statistics.median(hold.latencies) / statistics.median(bare)
        ratio_r = statistics.median(release.latencies) / statistics.median(bare)
        print(f"  Hold median / bare pair median = {ratio:.2f}; Release / bare = {ratio_r:.2f}")
        if hold.errors or release.errors:
            print(f"  errors: hold {dict(hold.errors)} release {dict(release.errors)}")
        a_hold, a_release = rounds.async_holds, rounds.async_releases
        a_errors = rounds.async_errors
        a_ratio = statistics.median(a_hold) / statistics.median(bare)
        print(
            f"  AsyncAdapter n={len(a_hold)} Hold median {ms(statistics.median(a_hold))}"
            f"  p99 {ms(pct(a_hold, 0.99))}; Release median {ms(statistics.median(a_release))}"
            f"; Hold / bare = {a_ratio:.2f}, / sync Hold ="
            f" {statistics.median(a_hold) / statistics.median(hold.latencies):.2f}"
            + (f"; errors {a_errors}" if a_errors else "")
        )
        summary.update(
            gap_p50=statistics.median(all_gaps),
            gap_p99=pct(all_gaps, 0.99),
            ratio=ratio,
            async_ratio=a_ratio,
            requests=statistics.median(list(hold.http.elements())),
        )
        for hz in (20.0, 50.0):
            storm_ref = bench.make_job(f"storm-{hz:.0f}")
            bench.cycle(storm_ref, 2, CallStats(), CallStats())
            rate, line = storm_run(cluster, bench, storm_ref, hz, storm_calls)
            print(f"  storm {line}")
            summary[f"success_{hz:.0f}hz"] = rate
    finally:
        bench.close()
    return summary


class BusyLoops:
    """``count`` processes spinning at the same priority as this one (a busy node)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(0.5)  # let the scheduler see them
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:  # only the processes this benchmark started
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="Hold and Release calls each")
    parser.add_argument("--storm-calls", type=int, default=100, help="cycles under each storm")
    parser.add_argument("--modes", default="kueue,plain")
    parser.add_argument(
        "--contention",
        action="store_true",
        help="also run with both cores loaded by two busy loops at the same priority",
    )
    parser.add_argument("--busy-loops", type=int, default=2)
    args = parser.parse_args()
    began = time.monotonic()
    summaries: list[Obj] = []
    with LocalCluster() as cluster:
        print(f"local control plane up in {cluster.startup_seconds:.1f}s ({cluster.server_url})")
        for mode in args.modes.split(","):
            summaries.append(run_mode(cluster, mode, args.n, args.storm_calls, "quiet"))
        if args.contention:
            with BusyLoops(args.busy_loops):
                for mode in args.modes.split(","):
                    phase = f"contended ({args.busy_loops} busy loops)"
                    summaries.append(run_mode(cluster, mode, args.n, args.storm_calls, phase))
    print("\n== summary (gap = CPU and waiting between a read's answer and the write)")
    print(f"  {'mode':<6} {'phase':<26} {'gap p50':>8} {'gap p99':>8} {'req':>4}"
          f" {'/bare':>6} {'async':>6} {'20 Hz':>7} {'50 Hz':>7}")  # fmt: skip
    for s in summaries:
        print(
            f"  {s['mode']:<6} {s['phase']:<26} {ms(s['gap_p50']):>8} {ms(s['gap_p99']):>8}"
            f" {s['requests']:>4.0f} {s['ratio']:>6.2f} {s['async_ratio']:>6.2f}"
            f" {s['success_20hz']:>6.1f}%"
            f" {s['success_50hz']:>6.1f}%"
        )
    print(f"\ntotal {time.monotonic() - began:.0f}s")


if __name__ == "__main__":
    main()
