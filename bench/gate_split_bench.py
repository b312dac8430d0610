"""The enforcer's review latency while the readmission gate re-lists P pods, with the gate
inside the enforcer's process (before) and in its own process (after). A script, not a test.

    .venv/bin/python bench/gate_split_bench.py [--pods 100000] [--rate 200] [--quiet 10]
        [--rounds 1] [--before-tree /work/main] [--json]

On one local control plane (etcd + kube-apiserver, no controllers), it creates P pods of
JobSets (label ``jobset.sigs.k8s.io/jobset-name``, 50 a job, Pending: no scheduler), as
``bench/scale_bench.py`` does. Then, for each arrangement:

- **before**: ``holdwarden serve`` of the tree ``--before-tree`` (the code before the split,
  run from that checkout: ``PYTHONPATH`` is that tree) with ``readmission.enabled: true``:
  the gate's threads start inside the enforcer's asyncio process, right after it serves.
- **after**: ``holdwarden serve`` of this tree, then ``holdwarden gate`` of this tree in a
  process of its own, started when the enforcer serves.

From the moment the enforcer serves, this process sends AdmissionReviews to it over
keep-alive TLS at a fixed rate (open loop: latency is measured from each request's
scheduled send time, so queueing counts), the review mix of ``bench/webhook_bench.py``
(10-30 KB TrainJob and Workload UPDATEs, 10% refused, each refusal fsync'd to the audit
file). The reviews answered while the gate's pod cache is still filling (its start-up LIST
of P pods, in pages of 500: the same work as a relist after an expired watch) are the
**relist** window; then ``--quiet`` seconds more with the gate idle on its watches are the
**quiet** window. It prints p50, p99 and max of each window, side by side, the relist's
duration, and the CPU seconds each process used.

Both arrangements share the machine with the apiserver, etcd and this load generator; on a
machine with fewer free cores than processes the "after" gate still competes for CPU, but
no longer for the enforcer's GIL and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale_bench import _create_pods  # noqa: E402
from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import Connection, build_bodies, http_request, percentile  # noqa: E402
from rig.localcluster import LocalCluster  # noqa: E402

CONNECTIONS = 8
_CACHED_PODS = re.compile(
    r'^holdwarden_readmission_cached_objects\{resource="pods"\} ([0-9.e+]+)$', re.M
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as got:
            return got.status, got.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Window:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    def summary(self) -> dict[str, Any]:
        values = self.latencies or [float("nan")]
        return {
            "reviews": len(self.latencies),
            "p50_ms": round(percentile(values, 0.5) * 1000, 2),
            "p99_ms": round(percentile(values, 0.99) * 1000, 2),
            "max_ms": round(max(values) * 1000, 2),
            "errors": self.errors,
        }


async def load(
    port: int,
    context: ssl.SSLContext,
    rate: float,
    synced: asyncio.Event,
    quiet: float,
) -> tuple[Window, Window, float]:
    """Reviews at ``rate``/s until ``quiet`` s after ``synced``; (relist, quiet, relist_s)."""
    requests = [(http_request(body), refuse) for body, refuse in build_bodies()]
    conns = [await Connection.open(port, context) for _ in range(CONNECTIONS)]
    queue: asyncio.Queue[tuple[float, bytes, Window] | None] = asyncio.Queue()
    relist, after = Window(), Window()

    async def worker(conn: Connection) -> None:
        while (item := await queue.get()) is not None:
            scheduled, request, window = item
            try:
                await conn.roundtrip(request)
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                window.errors += 1
                continue
            window.latencies.append(time.perf_counter() - scheduled)

    workers = [asyncio.create_task(worker(conn)) for conn in conns]
    start = time.perf_counter()
    synced_at: float | None = None
    i = 0
    while True:
        target = start + i / rate
        if synced_at is None and synced.is_set():
            synced_at = time.perf_counter()
        if synced_at is not None and target > synced_at + quiet:
            break
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        request = requests[i % len(requests)][0]
        queue.put_nowait((target, request, relist if synced_at is None else after))
        i += 1
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    for conn in conns:
        conn.close()
    return relist, after, (synced_at or start) - start


async def watch_cache(metrics_url: str, pods: int, synced: asyncio.Event) -> None:
    """Set ``synced`` once the gate's /metrics counts ``pods`` cached pods (or more)."""
    while True:
        status, text = await asyncio.to_thread(get, metrics_url)
        match = _CACHED_PODS.search(text) if status == 200 else None
        if match is not None and float(match[1]) >= pods:
            synced.set()
            return
        await asyncio.sleep(1.0)


def start(command: list[str], tree: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "holdwarden.cli", *command],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
    )


def wait_ready(url: str, proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while get(url)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"not ready at {url}: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def arrangement(
    name: str,
    tree: Path,
    cluster: LocalCluster,
    work: Path,
    pods: int,
    rate: float,
    quiet: float,
) -> dict[str, Any]:
    """One run: serve (and the gate), the load through the relist and the quiet window."""
    cert_dir = work / "tls"
    context = write_serving_tls(cert_dir)
    port, metrics, gate_metrics = free_port(), free_port(), free_port()
    readmission: dict[str, Any] = {
        "enabled": True,
        "controllerName": f"holdwarden.io/bench-{uuid.uuid4().hex[:6]}",
        "leaderElection": False,
    }
    if name == "after":
        readmission["metricsAddress"] = f"127.0.0.1:{gate_metrics}"
    config = {
        "webhook": {
            "listenAddress": f"127.0.0.1:{port}",
            "metricsAddress": f"127.0.0.1:{metrics}",
            "certDir": str(cert_dir),
            "auditSinks": ["file"],
            "auditLog": str(work / "audit.jsonl"),
        },
        "readmission": readmission,
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)}
    serve_log = work / "serve.log"
    serve = start(["serve", "--config", str(work / "config.yaml")], tree, env, serve_log)
    gate: subprocess.Popen[str] | None = None
    try:
        wait_ready(f"http://127.0.0.1:{metrics}/readyz", serve, serve_log)
        if name == "after":
            gate = start(["gate", "--config", str(work / "config.yaml")], tree, env, work / "g.log")
            cache_url = f"http://127.0.0.1:{gate_metrics}/metrics"
        else:
            cache_url = f"http://127.0.0.1:{metrics}/metrics"  # the gate's, in serve's

        async def run() -> tuple[Window, Window, float]:
            synced = asyncio.Event()
            watcher = asyncio.create_task(watch_cache(cache_url, pods, synced))
            try:
                return await load(port, context, rate, synced, quiet)
            finally:
                watcher.cancel()

        relist, after, relist_s = asyncio.run(run())
        cpu = {"serve_s": round(cpu_seconds(serve.pid), 1)}
        if gate is not None:
            cpu["gate_s"] = round(cpu_seconds(gate.pid), 1)
    finally:
        for proc in (gate, serve):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return {
        "relist_s": round(relist_s, 1),
        "relist": relist.summary(),
        "quiet": after.summary(),
        "cpu": cpu,
    }


def tree_commit(tree: Path) -> str:
    result = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=200.0, help="reviews a second")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds after the relist")
    parser.add_argument("--rounds", type=int, default=1, help="before/after pairs to run")
    parser.add_argument(
        "--before-tree",
        type=Path,
        default=Path("/work/main"),
        help="checkout whose code runs the gate inside `holdwarden serve`",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.before_tree / "holdwarden").is_dir():
        parser.error(f"--before-tree {args.before_tree} is not a holdwarden checkout")
    report: dict[str, Any] = {
        "pods": args.pods,
        "rate_per_s": args.rate,
        "cpus": os.cpu_count(),
        "before_tree": f"{args.before_tree} ({tree_commit(args.before_tree)})",
        "after_tree": f"{ROOT} ({tree_commit(ROOT)})",
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="holdwarden-split-") as tmp, LocalCluster() as cluster:
        namespace = cluster.create_namespace(f"gate-{uuid.uuid4().hex[:6]}")
        report["create_pods_s"] = round(_create_pods(cluster, namespace, args.pods), 1)
        print(f"created {args.pods} pods in {report['create_pods_s']} s", file=sys.stderr)
        for round_ in range(args.rounds):
            for name, tree in (("before", args.before_tree), ("after", ROOT)):
                work = Path(tmp) / f"{name}-{round_}"
                work.mkdir()
                row = arrangement(name, tree, cluster, work, args.pods, args.rate, args.quiet)
                report["runs"].append({"arrangement": name, "round": round_, **row})
                print(f"{name} (round {round_}): {row}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"Enforcer review latency while the gate lists {args.pods} pods "
        f"({args.rate:g} reviews/s, {report['cpus']} CPUs; before: {report['before_tree']}, "
        f"after: {report['after_tree']})"
    )
    header = (
        f"{'arrangement':<12}{'window':<8}{'reviews':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'max ms':>9}{'errors':>7}  relist s  CPU s"
    )
    print(header)
    for run in report["runs"]:
        for window in ("relist", "quiet"):
            figures = run[window]
            extra = f"  {run['relist_s']:>8}  {run['cpu']}" if window == "relist" else ""
            print(
                f"{run['arrangement']:<12}{window:<8}{figures['reviews']:>8}"
                f"{figures['p50_ms']:>9}{figures['p99_ms']:>9}{figures['max_ms']:>9}"
                f"{figures['errors']:>7}{extra}"
            )


if __name__ == "__main__":
    main()
