"""Benchmark of the admission enforcer (a script, not a test).

    .venv/bin/python bench/webhook_bench.py [--duration 5] [--rates 200,1000,3000] [--json]

What it does, in one run:
  1. In-process decision time: parse + evaluate of realistic 10-30 KB TrainJob and Workload
     AdmissionReviews (p50/p99 in microseconds). Target: p50 <= 100 us.
  2. Starts the enforcer (``EnforcerServer``: TLS, real audit log with fsync, metrics) in a
     separate process pinned to ONE core (``os.sched_setaffinity``), and drives it from this
     process (pinned to another core when there is one) over keep-alive TLS connections on
     loopback:
       - open loop at fixed rates (default 200, 1000, 3000 reviews/s); latency is measured
         from each request's scheduled send time, so queueing counts (no coordinated
         omission). Target: p99 <= 10 ms at 1000/s.
       - closed loop (32 connections, as fast as it answers): the capacity of one core.
         Target: >= 2000 reviews/s.
  3. The same against the framework floor: a minimal aiohttp app on the same TLS setup
     whose handler reads the body and always answers "allowed"; prints the ratios.
  It prints achieved reviews/s, p50/p99 latency, the server's peak RSS (VmHWM) and the
  server's CPU time per review (utime+stime of the whole process from /proc, all threads):
  1e6 / that is what one core can sustain, a figure that stays meaningful when other
  processes compete for the machine.

The review mix: TrainJob and Workload UPDATEs of 10-30 KB (managedFields, last-applied
configuration, trainer env), 10% of them refused (these also pay the audit line, its
fdatasync and a log line). A second closed loop sends only allowed reviews, which is what
real traffic nearly always is (refusals are rare events).
The client is a small HTTP/1.1 client on asyncio streams, so the load generator costs less
CPU than the server it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tlsfixture import write_serving_tls  # noqa: E402
from holdwarden.config import Config  # noqa: E402
from holdwarden.webhook.review import parse_review  # noqa: E402
from holdwarden.webhook.rules import RulesConfig, evaluate  # noqa: E402
from tests.support.review_samples import inflate, review, trainjob, workload  # noqa: E402

CONNECTIONS = 32


# --- the review mix --------------------------------------------------------------------------


def build_bodies(count: int = 200, seed: int = 7) -> list[tuple[bytes, bool]]:
    """``count`` request bodies of 10-30 KB and whether each must be refused."""
    rng = random.Random(seed)
    bodies: list[tuple[bytes, bool]] = []
    for i in range(count):
        size = rng.randrange(10_000, 30_000) // 2  # old + new object
        refuse = i % 10 == 0
        if i % 2 == 0:
            old = trainjob(suspend=True, instance="3", queue=True, name=f"job-{i}")
            new = trainjob(suspend=not refuse, instance="3", queue=True, name=f"job-{i}")
            if not refuse:
                new["metadata"]["labels"]["team"] = "ml"
            doc = review(old=inflate(old, size), new=inflate(new, size), name=f"job-{i}")
        else:
            old = workload(active=False, instance="4", name=f"wl-{i}")
            new = workload(active=refuse, instance="4", name=f"wl-{i}")
            doc = review(
                resource="workloads",
                old=inflate(old, size),
                new=inflate(new, size),
                user="system:serviceaccount:kueue-system:kueue-controller-manager",
                name=f"wl-{i}",
            )
        bodies.append((json.dumps(doc, separators=(",", ":")).encode(), refuse))
    return bodies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def decision_times(bodies: list[tuple[bytes, bool]], rounds: int = 40) -> dict[str, float]:
    """In-process parse + evaluate, microseconds."""
    rules = RulesConfig.from_config(Config())
    samples: list[float] = []
    for _ in range(rounds):
        for body, refuse in bodies:
            start = time.perf_counter_ns()
            verdict = evaluate(parse_review(body).change, rules)
            samples.append((time.perf_counter_ns() - start) / 1000)
            assert (verdict is not None) is refuse
    sizes = [len(body) for body, _ in bodies]
    return {
        "p50_us": percentile(samples, 0.50),
        "p99_us": percentile(samples, 0.99),
        "mean_us": statistics.fmean(samples),
        "body_kb_min": min(sizes) / 1024,
        "body_kb_max": max(sizes) / 1024,
        "samples": len(samples),
    }


# --- the servers (child process) -------------------------------------------------------------


def serving_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a bench server runs on: uvloop's with ``WEBHOOK_BENCH_LOOP=uvloop``
    (bench/review_ab.py --uvloop sets it; bench/connection_probe.py and bench/burst_probe.py
    pass it on to their server), otherwise asyncio's default."""
    from holdwarden.cli.enforcer import event_loop_factory

    return event_loop_factory(
        "uvloop" if os.environ.get("WEBHOOK_BENCH_LOOP") == "uvloop" else "asyncio"
    )


def serve(role: str, cert_dir: Path, work: Path, cpu: int | None) -> None:
    """Child process: pin to ``cpu``, serve ``role`` on a free port, print the port."""
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    import logging

    from aiohttp import web

    from holdwarden.certs.reload import ReloadingTLS
    from holdwarden.cli.enforcer import EnforcerServer
    from holdwarden.cli.logs import configure_logging
    from holdwarden.config import WebhookConfig

    async def main() -> None:
        tls = ReloadingTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
        if role in ("enforcer", "enforcer-narrow"):
            if role == "enforcer-narrow":
                # The enforcer as it was before wide reads: every read READ_BUFFER, whatever
                # the body (bench/large_review_bench.py runs it beside the shipped one).
                from holdwarden.webhook import connections

                connections.WIDE_READ_BUFFER = connections.READ_BUFFER
            logging.getLogger().handlers.clear()
            configure_logging(logging.INFO)
            config = Config(
                webhook=WebhookConfig(
                    listen_address="127.0.0.1:0",
                    metrics_address="127.0.0.1:0",
                    cert_dir=cert_dir,
                    audit_log=work / "audit.jsonl",
                )
            )
            server = EnforcerServer(config, tls=tls)
            await server.start()
            port = server.port
        else:
            answer = (
                b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
                b'"response":{"uid":"x","allowed":true}}'
            )

            async def allow(request: web.Request) -> web.Response:
                await request.read()
                return web.Response(body=answer, content_type="application/json")

            app = web.Application(client_max_size=3 * 1024 * 1024)
            app.add_routes([web.post("/validate", allow)])
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.ssl_context)
            await site.start()
            port = runner.addresses[0][1]
        print(port, flush=True)
        await asyncio.Event().wait()

    loop_factory = serving_loop_factory()
    profile_to = os.environ.get("WEBHOOK_BENCH_PROFILE")
    if not profile_to:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(main())
        return
    # Profiling aid: WEBHOOK_BENCH_PROFILE=path writes cProfile stats there on SIGTERM.
    import cProfile
    import signal

    profiler = cProfile.Profile()

    def dump(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(profile_to)
        os._exit(0)

    signal.signal(signal.SIGTERM, dump)
    profiler.enable()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


# --- the load generator ----------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection over TLS."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, context: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1", limit=1 << 20
        )
        return cls(reader, writer)

    async def roundtrip(self, request: bytes) -> bytes:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
        return body

    def close(self) -> None:
        self.writer.close()


def http_request(body: bytes) -> bytes:
    head = (
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Result:
    label: str
    offered: float | None
    completed: int = 0
    wrong: int = 0
    errors: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    allowed_latencies: list[float] = field(default_factory=list)
    refused_latencies: list[float] = field(default_factory=list)
    server_cpu_s: float = 0.0

    def record(self, seconds: float, refuse: bool) -> None:
        self.latencies.append(seconds)
        (self.refused_latencies if refuse else self.allowed_latencies).append(seconds)

    @property
    def cpu_us_per_review(self) -> float:
        return self.server_cpu_s / self.completed * 1e6 if self.completed else float("nan")

    @property
    def rate(self) -> float:
        return self.completed / self.elapsed if self.elapsed else 0.0

    def summary(self) -> dict[str, Any]:
        lat = self.latencies or [float("nan")]
        allowed = self.allowed_latencies or [float("nan")]
        refused = self.refused_latencies or [float("nan")]
        return {
            "run": self.label,
            "offered_per_s": self.offered,
            "achieved_per_s": round(self.rate, 1),
            "p50_ms": round(percentile(lat, 0.5) * 1000, 3),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 3),
            "allowed_p99_ms": round(percentile(allowed, 0.99) * 1000, 3),
            "refused_p50_ms": round(percentile(refused, 0.5) * 1000, 3),
            "refused_p99_ms": round(percentile(refused, 0.99) * 1000, 3),
            "completed": self.completed,
            "server_cpu_us_per_review": round(self.cpu_us_per_review, 1),
            "one_core_capacity_per_s": round(1e6 / self.cpu_us_per_review, 1)
            if self.server_cpu_s
            else None,
            "wrong_verdicts": self.wrong,
            "errors": self.errors,
        }


def check(answer: bytes, refuse: bool, floor: bool) -> bool:
    if floor:
        return b'"allowed":true' in answer
    return (b'"allowed":false' in answer) is refuse


async def open_loop(
    port: int,
    context: ssl.SSLContext,
    requests: list[tuple[bytes, bool]],
    rate: float,
    duration: float,
    floor: bool,
) -> Result:
    """Send at ``rate``/s for ``duration`` s; latency from each request's scheduled time."""
    conns = [await Connection.open(port, context) for _ in range(CONNECTIONS)]
    queue: asyncio.Queue[tuple[float, bytes, bool] | None] = asyncio.Queue()
    result = Result(f"{'floor' if floor else 'enforcer'} @{rate:g}/s", rate)
    last_done = 0.0

    async def worker(conn: Connection) -> None:
        nonlocal last_done
        while (item := await queue.get()) is not None:
            scheduled, request, refuse = item
            try:
                answer = await conn.roundtrip(request)
            except (OSError, RuntimeError, asyncio.IncompleteReadError):
                result.errors += 1
                continue
            now = time.perf_counter()
            last_done = now
            result.record(now - scheduled, refuse)
            result.completed += 1
            result.wrong += not check(answer, refuse, floor)

    workers = [asyncio.create_task(worker(conn)) for conn in conns]
    total = int(rate * duration)
    start = time.perf_counter()
    for i in range(total):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        request, refuse = requests[i % len(requests)]
        queue.put_nowait((target, request, refuse))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    result.elapsed = max(last_done - start, duration)
    for conn in conns:
        conn.close()
    return result


async def closed_loop(
    port: int,
    context: ssl.SSLContext,
    requests: list[tuple[bytes, bool]],
    duration: float,
    floor: bool,
    suffix: str = "",
) -> Result:
    """``CONNECTIONS`` clients back to back for ``duration`` s: the server's capacity."""
    conns = [await Connection.open(port, context) for _ in range(CONNECTIONS)]
    result = Result(f"{'floor' if floor else 'enforcer'} max{suffix}", None)
    stop_at = time.perf_counter() + duration

    async def worker(n: int, conn: Connection) -> None:
        i = n
        while time.perf_counter() < stop_at:
            request, refuse = requests[i % len(requests)]
            i += CONNECTIONS
            sent = time.perf_counter()
            answer = await conn.roundtrip(request)
            result.record(time.perf_counter() - sent, refuse)
            result.completed += 1
            result.wrong += not check(answer, refuse, floor)

    start = time.perf_counter()
    await asyncio.gather(*(worker(n, conn) for n, conn in enumerate(conns)))
    result.elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fdatasync_latency(directory: Path, count: int = 200) -> dict[str, float]:
    """What one append + fdatasync costs on this disk now (ms): the floor of a refusal."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    samples = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            os.write(fd, b"x" * 600 + b"\n")
            os.fdatasync(fd)
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50_ms": percentile(samples, 0.5), "p99_ms": percentile(samples, 0.99)}


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def image_malloc_env(dockerfile: Path = ROOT / "Dockerfile") -> dict[str, str]:
    """The glibc malloc settings the image's ``ENV`` sets (``MALLOC_*``), read from the
    Dockerfile so that a server here runs as it does in the image."""
    found: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ENV "):
            for word in line[4:].split():
                name, _, value = word.partition("=")
                if name.startswith("MALLOC_") and value:
                    found[name] = value
    return found


def start_server(
    role: str, cert_dir: Path, work: Path, cpu: int | None
) -> tuple[subprocess.Popen[str], int]:
    """Serve ``role`` in its own process, with the image's malloc settings (every role
    alike, the floor included, so a ratio compares the servers and not the allocator)."""
    command = [sys.executable, __file__, "--serve", role, "--cert-dir", str(cert_dir)]
    command += ["--work", str(work)]
    if cpu is not None:
        command += ["--cpu", str(cpu)]
    log = (work / f"{role}.log").open("w")
    env = {**os.environ, **image_malloc_env()}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"{role} server did not start: {(work / f'{role}.log').read_text()}")
    return proc, int(line)


async def drive(
    role: str,
    cert_dir: Path,
    work: Path,
    server_cpu: int | None,
    requests: list[tuple[bytes, bool]],
    rates: list[float],
    duration: float,
) -> tuple[list[Result], float]:
    proc, port = start_server(role, cert_dir, work, server_cpu)
    context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    floor = role == "floor"
    try:
        await open_loop(port, context, requests, 200, 1.0, floor)  # warm-up
        results = []
        allowed_only: list[tuple[bytes, bool]] = [
            (request, refuse) for request, refuse in requests if not refuse
        ]
        for rate in [*rates, None, -1.0]:
            before = cpu_seconds(proc.pid)
            if rate is None:
                result = await closed_loop(port, context, requests, duration, floor)
            elif rate < 0:
                result = await closed_loop(
                    port, context, allowed_only, duration, floor, " (all allowed)"
                )
            else:
                result = await open_loop(port, context, requests, rate, duration, floor)
            result.server_cpu_s = cpu_seconds(proc.pid) - before
            results.append(result)
        rss = peak_rss_mb(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return results, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--rates", default="200,1000,3000")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--serve", choices=("enforcer", "enforcer-narrow", "floor"), help=argparse.SUPPRESS
    )
    parser.add_argument("--cert-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.cert_dir, args.work, args.cpu)
        return

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    server_cpu = cpus[-1] if cpus else None
    if len(cpus) > 1:
        os.sched_setaffinity(0, set(cpus[:-1]))  # the client keeps off the server's core
    rates = [float(r) for r in args.rates.split(",")]

    bodies = build_bodies()
    decision = decision_times(bodies)
    requests = [(http_request(body), refuse) for body, refuse in bodies]
    report: dict[str, Any] = {
        "cpus": len(cpus),
        "server_cpu": server_cpu,
        "connections": CONNECTIONS,
        "duration_s": args.duration,
        "decision": decision,
    }
    with tempfile.TemporaryDirectory(prefix="holdwarden-bench-") as tmp:
        work = Path(tmp)
        write_serving_tls(work)
        report["fdatasync"] = fdatasync_latency(work)
        runs: dict[str, Any] = {}
        for role in ("enforcer", "floor"):
            results, rss = asyncio.run(
                drive(role, work, work, server_cpu, requests, rates, args.duration)
            )
            runs[role] = {"results": [r.summary() for r in results], "peak_rss_mb": rss}
        audit_lines = sum(1 for _ in (work / "audit.jsonl").open("rb"))
    report["runs"] = runs
    report["audit_lines"] = audit_lines
    enforcer, floor = runs["enforcer"]["results"], runs["floor"]["results"]
    report["ratios"] = [
        {
            "run": e["run"].replace("enforcer ", ""),
            "p50_x": round(e["p50_ms"] / f["p50_ms"], 2) if f["p50_ms"] else None,
            "p99_x": round(e["p99_ms"] / f["p99_ms"], 2) if f["p99_ms"] else None,
            "throughput_x": round(e["achieved_per_s"] / f["achieved_per_s"], 2)
            if f["achieved_per_s"]
            else None,
            "cpu_per_review_x": round(
                e["server_cpu_us_per_review"] / f["server_cpu_us_per_review"], 2
            ),
        }
        for e, f in zip(enforcer, floor, strict=True)
    ]
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print_report(report)


def print_report(report: dict[str, Any]) -> None:
    d = report["decision"]
    print(
        f"cpus={report['cpus']} server pinned to cpu {report['server_cpu']}, "
        f"{report['connections']} keep-alive TLS connections, {report['duration_s']:g}s per run"
    )
    print(
        f"decision in-process (parse+evaluate, {d['body_kb_min']:.0f}-{d['body_kb_max']:.0f} KB): "
        f"p50 {d['p50_us']:.1f} us, p99 {d['p99_us']:.1f} us, mean {d['mean_us']:.1f} us "
        f"over {d['samples']} samples  [target p50 <= 100 us]"
    )
    f = report["fdatasync"]
    print(
        f"disk: append + fdatasync p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms "
        f"(a refusal waits for one; allowed reviews never do)"
    )
    header = (
        f"{'run':<28}{'offered/s':>10}{'achieved/s':>12}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'allow p99':>10}{'deny p50':>9}{'deny p99':>9}"
        f"{'errors':>7}{'wrong':>6}{'cpu us/rev':>11}{'1-core cap/s':>13}"
    )
    for role in ("enforcer", "floor"):
        run = report["runs"][role]
        print(f"\n{role} (peak RSS {run['peak_rss_mb']:.1f} MB)")
        print(header)
        for r in run["results"]:
            offered = f"{r['offered_per_s']:g}" if r["offered_per_s"] else "max"
            print(
                f"{r['run']:<28}{offered:>10}{r['achieved_per_s']:>12.1f}{r['p50_ms']:>9.2f}"
                f"{r['p99_ms']:>9.2f}{r['allowed_p99_ms']:>10.2f}{r['refused_p50_ms']:>9.2f}"
                f"{r['refused_p99_ms']:>9.2f}{r['errors']:>7}{r['wrong_verdicts']:>6}"
                f"{r['server_cpu_us_per_review']:>11.1f}{r['one_core_capacity_per_s'] or 0:>13.0f}"
            )
    print("\nenforcer / floor")
    for r in report["ratios"]:
        print(
            f"{r['run']:<20} p50 x{r['p50_x']}  p99 x{r['p99_x']}  "
            f"throughput x{r['throughput_x']}  server CPU/review x{r['cpu_per_review_x']}"
        )
    print(f"\naudit lines written (refusals, fsynced): {report['audit_lines']}")
    print("targets: decision p50 <= 100 us; >= 2000 reviews/s on one core; p99 <= 10 ms at 1000/s")


if __name__ == "__main__":
    main()
