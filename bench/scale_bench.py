"""Costs at the size of a training cluster, on the real kube-apiserver (a script, not a test).

    .venv/bin/python bench/scale_bench.py [--sizes 1000,10000] [--holds 1000] [--json]

For each population size N, on one local control plane (etcd + kube-apiserver, no
controllers), it grows the population to N TrainJobs and N Workloads (each Workload owned
by its TrainJob and labelled with its uid, as Kueue makes them), created directly, and then:

1. **UPDATE latency**: the p50 and p99 of real label UPDATEs of a held TrainJob and a held
   Workload, in three namespaces side by side (writes take turns): no admission, the
   enforcer (registered as shipped, called over TLS), and its ValidatingAdmissionPolicy
   twin. The enforcer's added latency is its figure minus "none", in the same run.
2. **Concurrent holds**: ``--holds`` Holds placed at once with ``AsyncAdapter`` (Kueue mode)
   on that many TrainJobs of the population, then as many Releases: calls/s and the p50 and
   p99 of one call; then every Workload is read back: a hold lost (no annotation after its
   Hold succeeded, or one left after its Release) or doubled (an instance other than the one
   placed) is counted, and must be 0.

3. **The readmission gate at scale** (``--pods``): P pods of JobSets (label
   ``jobset.sigs.k8s.io/jobset-name``, 50 per job, Pending: no scheduler here) created
   directly; then the real ``ReadmissionGate`` in a process of its own: the time from its
   start until its four watch caches are filled (the LISTs), its RSS then, and its decision
   latency: one gated Workload waits on its job's last pod; that pod is deleted and the time
   until the gate has marked the check Ready is measured (five times).

What grows with N and what must not: see docs/performance/scale.md. The suite runs a small
version (``tests/controlplane/test_scale_smoke.py``) that checks the counts, not the times.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client as k8s  # noqa: E402

from holdwarden.adapter import CallMeta, Config, Ref  # noqa: E402
from holdwarden.adapter.aio import AsyncAdapter  # noqa: E402
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations  # noqa: E402
from rig.builders import kueue_workload_body, trainjob_body, workload_body  # noqa: E402
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster  # noqa: E402

A = Annotations()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Population:
    """N TrainJobs and their Workloads in one namespace, grown in place."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.names: list[str] = []
        self.workloads: dict[str, str] = {}

    def _create_one(self, api: k8s.CustomObjectsApi, name: str) -> tuple[str, str]:
        tj = trainjob_body(name, queue="user-queue", suspend=True)
        made: Any = api.create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, self.namespace, TRAINJOB.plural, tj
        )
        wl = kueue_workload_body(made, queue="user-queue")
        api.create_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, self.namespace, WORKLOAD.plural, wl
        )  # fmt: skip
        return name, wl["metadata"]["name"]

    def grow_to(self, size: int, threads: int = 8) -> float:
        """Create objects until there are ``size`` of each; returns the seconds it took."""
        began = time.monotonic()
        todo = [f"job-{i:06d}" for i in range(len(self.names), size)]
        clients = [self.cluster.api_client() for _ in range(threads)]
        try:
            apis = [k8s.CustomObjectsApi(c) for c in clients]
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                futures = [
                    pool.submit(self._create_one, apis[i % threads], name)
                    for i, name in enumerate(todo)
                ]
                for future in futures:
                    name, wl_name = future.result()
                    self.names.append(name)
                    self.workloads[name] = wl_name
        finally:
            for c in clients:
                c.close()  # type: ignore[no-untyped-call]
        return time.monotonic() - began


def update_latency(cluster: LocalCluster, work: Path, writes: int) -> dict[str, dict[str, float]]:
    """p50/p99 (ms) of label UPDATEs, per configuration and kind, taking turns."""
    from tests.controlplane.test_policy_parity import policy_only, webhook_only

    token = uuid.uuid4().hex[:8]
    label = "holdwarden.io/policy-parity"
    spaces = {
        tag: cluster.create_namespace(f"lat-{tag}-{token}", labels={label: f"{tag}-{token}"})
        for tag in ("none", "webhook", "policy")
    }
    notes = {A.hold_instance: "3", A.hold_reason: "r", A.held_at: "2026-01-01T00:00:00Z",
             A.held_by: "dispatch"}  # fmt: skip
    with cluster.api_client() as admin:
        api = k8s.CustomObjectsApi(admin)
        targets: list[tuple[str, str, tuple[str, str, str, str], str]] = []
        for tag, namespace in spaces.items():
            tj = trainjob_body(f"tj-{tag}", suspend=True)
            tj["metadata"]["annotations"] = dict(notes)
            coords = (TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural)
            made: Any = api.create_namespaced_custom_object(*coords, tj)
            targets.append((tag, "TrainJob", coords, f"tj-{tag}"))
            wl = workload_body(f"wl-{tag}", trainjob=made)
            wl["metadata"]["annotations"] = dict(notes)
            wl["spec"]["active"] = False
            wcoords = (WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural)
            api.create_namespaced_custom_object(*wcoords, wl)
            targets.append((tag, "Workload", wcoords, f"wl-{tag}"))
        times: dict[tuple[str, str], list[float]] = {(t, k): [] for t, k, _, _ in targets}
        with (
            webhook_only(admin, spaces["webhook"], f"webhook-{token}", work),
            policy_only(admin, spaces["policy"], f"policy-{token}"),
        ):
            for i in range(writes + 20):
                for tag, kind, coords, name in targets:
                    began = time.perf_counter()
                    api.patch_namespaced_custom_object(
                        *coords, name, {"metadata": {"labels": {"tick": str(i)}}},
                        _content_type="application/merge-patch+json",
                    )  # fmt: skip
                    if i >= 20:  # after the warm-up
                        times[(tag, kind)].append((time.perf_counter() - began) * 1000)
    out: dict[str, dict[str, float]] = {}
    for (tag, kind), values in times.items():
        out.setdefault(tag, {})[f"{kind} p50"] = round(statistics.median(values), 2)
        out[tag][f"{kind} p99"] = round(percentile(values, 0.99), 2)
    return out


async def concurrent_holds(
    cluster: LocalCluster, population: Population, count: int, instance: int
) -> dict[str, Any]:
    """``count`` Holds at once, then as many Releases; calls/s, p50/p99, lost/doubled."""
    names = population.names[:count]
    api = cluster.api_client(SUPERVISOR_IDENTITY)
    adapter = AsyncAdapter(Config(mode="kueue", holder="dispatch"), api)
    results: dict[str, Any] = {}
    try:
        deadline = datetime.now(UTC) + timedelta(minutes=5)
        await adapter.preflight(population.namespace)
        for verb in ("hold", "release"):
            latencies: list[float] = []
            failures: dict[str, int] = {}

            async def one(name: str, verb: str = verb, latencies: list[float] = latencies,
                          failures: dict[str, int] = failures) -> None:  # fmt: skip
                ref = Ref(population.namespace, name)
                meta = CallMeta(deadline, instance)
                began = time.perf_counter()
                try:
                    if verb == "hold":
                        await adapter.hold(ref, meta, "scale")
                    else:
                        await adapter.release(ref, meta)
                except Exception as exc:  # counted and reported, never hidden
                    failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                    return
                latencies.append((time.perf_counter() - began) * 1000)

            began = time.perf_counter()
            await asyncio.gather(*(one(name) for name in names))
            took = time.perf_counter() - began
            results[verb] = {
                "calls": len(names),
                "ok": len(latencies),
                "failures": failures,
                "calls_per_s": round(len(latencies) / took, 1),
                "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
                "p99_ms": round(percentile(latencies, 0.99), 1) if latencies else None,
            }
            results[verb]["lost"], results[verb]["doubled"] = _check(
                cluster, population, names, instance if verb == "hold" else None
            )
    finally:
        await adapter.aclose()
        api.close()  # type: ignore[no-untyped-call]
    return results


def _check(
    cluster: LocalCluster, population: Population, names: list[str], instance: int | None
) -> tuple[int, int]:
    """(lost, doubled): Workloads whose hold annotation is not what the calls left."""
    with cluster.api_client() as admin:
        listed: Any = k8s.CustomObjectsApi(admin).list_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, population.namespace, WORKLOAD.plural
        )
    by_name = {w["metadata"]["name"]: w for w in listed["items"]}
    lost = doubled = 0
    for name in names:
        found = (by_name[population.workloads[name]]["metadata"].get("annotations") or {}).get(
            A.hold_instance
        )
        if instance is None:
            lost += found is not None
        elif found is None:
            lost += 1
        elif found != str(instance):
            doubled += 1
    return lost, doubled


_GATE_CHILD = """
import json, sys, time
from datetime import timedelta
from kubernetes import client as k8s
from holdwarden.config import Config, ReadmissionConfig
from holdwarden.readmission.controller import ReadmissionGate
server, workdir, user, controller = sys.argv[1:5]
configuration = k8s.Configuration()
configuration.host = server
configuration.ssl_ca_cert = workdir + "/ca.crt"
configuration.cert_file = workdir + "/admin.crt"
configuration.key_file = workdir + "/admin.key"
api = k8s.ApiClient(configuration)
api.default_headers["Impersonate-User"] = user
config = Config(readmission=ReadmissionConfig(enabled=True, controller_name=controller,
                leader_election=False, interval=timedelta(seconds=30)))
began = time.monotonic()
gate = ReadmissionGate(config, api)
gate.start()
while not gate.synced():
    time.sleep(0.01)
synced = time.monotonic() - began
rss = 0
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        rss = int(line.split()[1])
print(json.dumps({"synced_s": synced, "rss_kib": rss,
                  "cached": {i.name: len(i.store) for i in gate.informers}}), flush=True)
sys.stdin.readline()  # until the parent is done
gate.stop(timeout=3)
"""


def _create_pods(cluster: LocalCluster, namespace: str, total: int, threads: int = 8) -> float:
    """``total`` Pending pods of JobSets ``js-<k>`` (50 each) in ``namespace``."""
    from holdwarden.vocabulary import JOBSET_NAME_LABEL

    began = time.monotonic()
    clients = [cluster.api_client() for _ in range(threads)]

    def one(core: k8s.CoreV1Api, i: int) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i:06d}", "labels": {JOBSET_NAME_LABEL: f"js-{i // 50}"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        core.create_namespaced_pod(namespace, body)

    try:
        cores = [k8s.CoreV1Api(c) for c in clients]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for future in [pool.submit(one, cores[i % threads], i) for i in range(total)]:
                future.result()
    finally:
        for c in clients:
            c.close()  # type: ignore[no-untyped-call]
    return time.monotonic() - began


def gate_at_scale(cluster: LocalCluster, pods: int, decisions: int = 5) -> dict[str, Any]:
    """The gate's start-up LIST time, RSS and decision latency with ``pods`` in its cache."""
    import subprocess

    from holdwarden.vocabulary import JOBSET_NAME_LABEL
    from rig.localcluster import GATE_IDENTITY
    from rig.localcluster.realstory import make_admission_check

    namespace = cluster.create_namespace(f"gate-{uuid.uuid4().hex[:6]}")
    created_s = _create_pods(cluster, namespace, pods)
    check = f"scale-{uuid.uuid4().hex[:6]}"
    controller = f"holdwarden.io/{check}"
    with cluster.api_client() as admin:
        make_admission_check(admin, check, controller)
        child = subprocess.Popen(
            [sys.executable, "-c", _GATE_CHILD, cluster.server_url, str(cluster.workdir),
             GATE_IDENTITY, controller],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert child.stdout is not None and child.stdin is not None
            started = json.loads(child.stdout.readline())
            custom, core = k8s.CustomObjectsApi(admin), k8s.CoreV1Api(admin)
            latencies: list[float] = []
            for k in range(decisions):
                name = f"gated-{k}"
                tj = trainjob_body(name, queue="user-queue", suspend=True)
                tj["metadata"]["annotations"] = {A.opened: "2026-01-01T00:00:00Z"}
                made: Any = custom.create_namespaced_custom_object(
                    TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, tj
                )
                pod: Any = {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{name}-0", "labels": {JOBSET_NAME_LABEL: name}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                }  # fmt: skip
                core.create_namespaced_pod(namespace, pod)
                wl: Any = custom.create_namespaced_custom_object(
                    WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
                    workload_body(f"wl-{name}", trainjob=made),
                )  # fmt: skip
                wl["status"] = {"admissionChecks": [{
                    "name": check, "state": "Pending", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
                custom.replace_namespaced_custom_object_status(
                    WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural,
                    wl["metadata"]["name"], wl,
                )  # fmt: skip

                def state(wl_name: str = wl["metadata"]["name"]) -> tuple[str, str]:
                    got: Any = custom.get_namespaced_custom_object(
                        WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, wl_name
                    )
                    entry = (got.get("status") or {}).get("admissionChecks") or [{}]
                    return str(entry[0].get("state")), str(entry[0].get("message"))

                until = time.monotonic() + 60
                while "pod(s)" not in state()[1] and time.monotonic() < until:
                    time.sleep(0.05)  # the gate has seen the pod and waits on it
                began = time.perf_counter()
                core.delete_namespaced_pod(f"{name}-0", namespace, grace_period_seconds=0)
                while state()[0] != "Ready":
                    if time.monotonic() > until + 60:
                        raise RuntimeError(f"the gate never admitted {name}: {state()}")
                    time.sleep(0.005)
                latencies.append((time.perf_counter() - began) * 1000)
        finally:
            if child.stdin is not None:
                child.stdin.write("\n")
                child.stdin.flush()
            child.wait(timeout=30)
    return {
        "pods": pods,
        "create_s": round(created_s, 1),
        "startup_list_s": round(started["synced_s"], 2),
        "rss_mib": round(started["rss_kib"] / 1024, 1),
        "cached": started["cached"],
        "decision_ms_p50": round(statistics.median(latencies), 1),
        "decision_ms_max": round(max(latencies), 1),
    }


def run(sizes: list[int], holds: int, writes: int, pods: list[int]) -> dict[str, Any]:
    report: dict[str, Any] = {"sizes": {}, "gate": {}}
    for count in sorted(pods):
        with LocalCluster() as cluster:  # a cluster of its own: its pods only
            report["gate"][str(count)] = gate_at_scale(cluster, count)
    with tempfile.TemporaryDirectory(prefix="holdwarden-scale-") as tmp, LocalCluster() as cluster:
        work = Path(tmp)
        namespace = cluster.create_namespace(f"pop-{uuid.uuid4().hex[:6]}")
        population = Population(cluster, namespace)
        for round_, size in enumerate(sorted(sizes)):
            grew = population.grow_to(size)
            row: dict[str, Any] = {"populate_s": round(grew, 1)}
            (work / str(size)).mkdir()
            row["update_ms"] = update_latency(cluster, work / str(size), writes)
            row["holds"] = asyncio.run(
                concurrent_holds(cluster, population, min(holds, size), instance=round_ + 1)
            )
            report["sizes"][str(size)] = row
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--holds", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--pods", default="1000,10000,100000", help="'' to skip the gate")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(
        [int(s) for s in args.sizes.split(",") if s],
        args.holds,
        args.writes,
        [int(p) for p in args.pods.split(",") if p],
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for count, row in report["gate"].items():
        print(f"readmission gate with {count} pods in its cache: {row}")
    for size, row in report["sizes"].items():
        print(f"N = {size} TrainJobs + {size} Workloads (created in {row['populate_s']} s)")
        for tag, figures in row["update_ms"].items():
            print(f"  UPDATE ms, {tag:>7}: {figures}")
        for verb, figures in row["holds"].items():
            print(f"  {verb:>7} x{figures['calls']} at once: {figures}")


if __name__ == "__main__":
    main()
