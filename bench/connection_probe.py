"""Connection-flood probe of the admission enforcer (a script, not a test).

    .venv/bin/python bench/connection_probe.py [--idle 2000] [--slowloris 500] [--hold 20]
        [--fresh 4]

(``WEBHOOK_BENCH_LOOP=uvloop`` in the environment serves on uvloop's event loop.)

It starts ``EnforcerServer`` with the shipped defaults (``webhook.maxConnections``,
timeouts...) in its own process. Then, at the same time:
  - it opens ``--idle`` TLS connections that complete the handshake and then say nothing;
  - it opens ``--slowloris`` TLS connections that start a request and trickle its headers
    one byte a second, never finishing them;
  - a separate process (so the attack's client work does not slow it) sends valid reviews
    over ``--reviewers`` keep-alive connections, the way the kube-apiserver does, and
    reconnects when a connection is closed;
  - with ``--fresh``, as many more reviewers that open a new TLS connection for every
    review (an apiserver with no idle connection left to reuse, or a second apiserver
    just started), each review timed from its connect;
and holds the attack for ``--hold`` seconds. None of the attacking connections reconnect.

It prints the server's RSS (sampled every 0.25 s, and the kernel's peak, VmHWM), what
became of the attacking connections, and the valid reviews' p50/p99 latency. The targets
are an RSS under 256 MiB (the Deployment's memory limit), a p99 under 100 ms, and for the
fresh clients a p99 under 200 ms; the exit status is 1 if any is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import (  # noqa: E402
    Connection,
    build_bodies,
    http_request,
    percentile,
    serving_loop_factory,
)

MEMORY_LIMIT_MIB = 256
P99_TARGET_MS = 100.0
FRESH_P99_TARGET_MS = 200.0
OPEN_CONCURRENCY = 50


# --- the server (child process) --------------------------------------------------------------


def serve(cert_dir: Path, work: Path) -> None:
    from holdwarden.certs.reload import ReloadingTLS
    from holdwarden.cli.enforcer import EnforcerServer
    from holdwarden.cli.logs import configure_logging
    from holdwarden.config import Config, WebhookConfig

    async def main() -> None:
        import logging

        configure_logging(logging.WARNING)
        config = Config(
            webhook=WebhookConfig(
                listen_address="127.0.0.1:0",
                metrics_address="127.0.0.1:0",
                cert_dir=cert_dir,
                audit_log=work / "audit.jsonl",
            )
        )
        server = EnforcerServer(
            config, tls=ReloadingTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
        )
        await server.start()
        print(server.port, flush=True)
        await asyncio.Event().wait()

    with asyncio.Runner(loop_factory=serving_loop_factory()) as runner:
        runner.run(main())


# --- the valid reviews (child process) -------------------------------------------------------


def review(port: int, ca: Path, duration: float, reviewers: int, fresh: int = 0) -> None:
    """Keep-alive reviewers for ``duration`` s, and ``fresh`` reviewers that connect anew
    for every review; prints one JSON line of latencies."""
    requests = [http_request(body) for body, refuse in build_bodies(40) if not refuse]
    context = ssl.create_default_context(cafile=str(ca))
    latencies: list[float] = []
    stamps: list[float] = []  # wall-clock time each review was answered
    errors: list[str] = []
    reconnects = 0
    fresh_latencies: list[float] = []
    fresh_errors: list[str] = []

    async def fresh_reviewer(index: int) -> None:
        deadline = time.monotonic() + duration
        i = index
        while time.monotonic() < deadline:
            request = requests[i % len(requests)]
            i += 1
            started = time.perf_counter()
            conn: Connection | None = None
            try:
                async with asyncio.timeout(10):  # the apiserver's webhook timeout
                    conn = await Connection.open(port, context)
                    answer = await conn.roundtrip(request)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, RuntimeError) as exc:
                fresh_errors.append(type(exc).__name__)
                continue
            finally:
                if conn is not None:
                    conn.close()
            fresh_latencies.append(time.perf_counter() - started)
            if b'"allowed":true' not in answer:
                fresh_errors.append("wrong verdict")
            await asyncio.sleep(0.02)

    async def reviewer(index: int) -> None:
        nonlocal reconnects
        conn: Connection | None = None
        deadline = time.monotonic() + duration
        i = index
        while time.monotonic() < deadline:
            request = requests[i % len(requests)]
            i += 1
            started = time.perf_counter()
            try:
                async with asyncio.timeout(10):
                    if conn is None:
                        conn = await Connection.open(port, context)
                    answer = await conn.roundtrip(request)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, RuntimeError) as exc:
                # Closed under us: reconnect and send again, as the apiserver's client does
                # when a reused connection turns out to be closed.
                errors.append(type(exc).__name__)
                reconnects += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            latencies.append(time.perf_counter() - started)
            stamps.append(time.time())
            if b'"allowed":true' not in answer:
                errors.append("wrong verdict")
            await asyncio.sleep(0.005)  # ~150 reviews/s per reviewer: real, not a flood
        if conn is not None:
            conn.close()

    async def main() -> None:
        await asyncio.gather(
            *(reviewer(n) for n in range(reviewers)),
            *(fresh_reviewer(n) for n in range(fresh)),
        )

    asyncio.run(main())
    print(
        json.dumps(
            {
                "reviews": len(latencies),
                "p50_ms": round(percentile(latencies, 0.5) * 1000, 2) if latencies else None,
                "p99_ms": round(percentile(latencies, 0.99) * 1000, 2) if latencies else None,
                "max_ms": round(max(latencies) * 1000, 2) if latencies else None,
                "reconnects": reconnects,
                "errors": sorted(set(errors)),
                "samples": [[t, x] for t, x in zip(stamps, latencies, strict=True)],
                "fresh": {
                    "reviews": len(fresh_latencies),
                    "p50_ms": round(percentile(fresh_latencies, 0.5) * 1000, 2)
                    if fresh_latencies
                    else None,
                    "p99_ms": round(percentile(fresh_latencies, 0.99) * 1000, 2)
                    if fresh_latencies
                    else None,
                    "max_ms": round(max(fresh_latencies) * 1000, 2) if fresh_latencies else None,
                    "failed": len(fresh_errors),
                    "errors": sorted(set(fresh_errors)),
                },
            }
        ),
        flush=True,
    )


# --- the attack (this process) ---------------------------------------------------------------


@dataclass
class Attack:
    port: int
    context: ssl.SSLContext
    opened: int = 0
    failed_to_open: int = 0
    closed_by_server: int = 0
    lifetimes: list[float] = field(default_factory=list)
    opening_s: float = 0.0  # from the first connect to the last connection opened
    started: float = field(default_factory=time.monotonic)
    wall_started: float = field(default_factory=time.time)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            async with asyncio.timeout(20):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, ssl=self.context, server_hostname="127.0.0.1"
                )
        except (OSError, TimeoutError, ssl.SSLError):
            self.failed_to_open += 1
            return None
        self.opened += 1
        self.opening_s = time.monotonic() - self.started
        self.writers.append(writer)
        return reader, writer

    async def idle(self, gate: asyncio.Semaphore, until: float) -> None:
        async with gate:
            pair = await self.connect()
        if pair is not None:
            await self._hold(*pair, until, trickle=None)

    async def slowloris(self, gate: asyncio.Semaphore, until: float) -> None:
        async with gate:
            pair = await self.connect()
        if pair is None:
            return
        _, writer = pair
        with contextlib.suppress(OSError):
            writer.write(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        await self._hold(*pair, until, trickle=b"a")

    async def _hold(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        until: float,
        trickle: bytes | None,
    ) -> None:
        opened = time.monotonic()
        while (left := until - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(min(1.0, left)):
                    data = await reader.read(1024)
                if not data:
                    self.closed_by_server += 1
                    self.lifetimes.append(time.monotonic() - opened)
                    return
            except TimeoutError:
                if trickle is not None:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.write(trickle)
            except (OSError, ssl.SSLError):
                self.closed_by_server += 1
                self.lifetimes.append(time.monotonic() - opened)
                return

    def close_all(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()


def rss_mib(pid: int, field_name: str = "VmRSS:") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name):
                return int(line.split()[1]) / 1024
    return float("nan")


async def attack(args: argparse.Namespace, port: int, pid: int, ca: Path) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    baseline = rss_mib(pid)
    duration = args.hold + 2.0
    reviewer = subprocess.Popen(
        [
            *(sys.executable, __file__, "--review", str(port), "--ca", str(ca)),
            *("--duration", str(duration), "--reviewers", str(args.reviewers)),
            *("--fresh", str(args.fresh)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    samples: list[float] = []
    stop_sampling = False

    async def sample() -> None:
        while not stop_sampling:
            samples.append(rss_mib(pid))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(1.0)  # the reviewers connect first, as the apiserver would have
    until = time.monotonic() + args.hold
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    state = Attack(port, context)
    started = state.started = time.monotonic()
    state.wall_started = time.time()
    tasks = [asyncio.create_task(state.idle(gate, until)) for _ in range(args.idle)]
    tasks += [asyncio.create_task(state.slowloris(gate, until)) for _ in range(args.slowloris)]
    await asyncio.gather(*tasks)
    attack_s = time.monotonic() - started
    still_open = state.opened - state.closed_by_server
    state.close_all()
    out, _ = await asyncio.get_running_loop().run_in_executor(None, reviewer.communicate)
    stop_sampling = True
    await sampler
    reviews = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    lifetimes = sorted(state.lifetimes)
    # Split the reviews: while the attack's connections were being opened (handshakes),
    # and while they were only held open.
    opened_at = state.wall_started + state.opening_s
    answered: list[list[float]] = reviews.pop("samples", [])
    during = [x for t, x in answered if state.wall_started <= t <= opened_at]
    holding = [x for t, x in answered if t > opened_at]
    for name, part in (("opening", during), ("holding", holding)):
        reviews[f"{name}_reviews"] = len(part)
        reviews[f"{name}_p99_ms"] = round(percentile(part, 0.99) * 1000, 2) if part else None
    return {
        "idle": args.idle,
        "slowloris": args.slowloris,
        "hold_s": args.hold,
        "attack_s": round(attack_s, 1),
        "opening_s": round(state.opening_s, 1),
        "opened": state.opened,
        "failed_to_open": state.failed_to_open,
        "closed_by_server": state.closed_by_server,
        "still_open_at_end": still_open,
        "closed_lifetime_p50_s": round(percentile(lifetimes, 0.5), 2) if lifetimes else None,
        "rss_baseline_mib": round(baseline, 1),
        "rss_peak_sampled_mib": round(max(samples), 1),
        "rss_hwm_mib": round(rss_mib(pid, "VmHWM:"), 1),
        "reviews": reviews,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--slowloris", type=int, default=500)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the attack lasts")
    parser.add_argument("--reviewers", type=int, default=4)
    parser.add_argument(
        "--fresh", type=int, default=0, help="reviewers that connect anew for every review"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--review", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.cert_dir, args.work)
        return
    if args.review:
        review(args.review, args.ca, args.duration, args.reviewers, args.fresh)
        return

    with tempfile.TemporaryDirectory(prefix="holdwarden-probe-") as tmp:
        work = Path(tmp)
        write_serving_tls(work, namespace="probe")
        command = [sys.executable, __file__, "--serve", "--cert-dir", str(work)]
        command += ["--work", str(work)]
        log = (work / "server.log").open("w")
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            if not line.strip().isdigit():
                raise SystemExit(f"server did not start: {(work / 'server.log').read_text()}")
            report = asyncio.run(attack(args, int(line), server.pid, work / "ca.crt"))
        finally:
            server.kill()
            server.wait()
    reviews = report["reviews"]
    ok_rss = report["rss_hwm_mib"] < MEMORY_LIMIT_MIB
    ok_p99 = reviews.get("p99_ms") is not None and reviews["p99_ms"] < P99_TARGET_MS
    fresh = reviews.get("fresh", {})
    ok_fresh = args.fresh == 0 or (
        fresh.get("p99_ms") is not None
        and fresh["p99_ms"] < FRESH_P99_TARGET_MS
        and fresh.get("failed") == 0
    )
    report["pass"] = ok_rss and ok_p99 and ok_fresh
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"attack: {report['idle']} idle + {report['slowloris']} slowloris TLS connections, "
            f"held {report['hold_s']:g}s; opened {report['opened']} in {report['opening_s']}s, "
            f"failed to open {report['failed_to_open']}, closed by the server "
            f"{report['closed_by_server']} (p50 lifetime {report['closed_lifetime_p50_s']}s), "
            f"open at the end {report['still_open_at_end']}"
        )
        print(
            f"server RSS: {report['rss_baseline_mib']} MiB before, peak "
            f"{report['rss_peak_sampled_mib']} MiB sampled, VmHWM {report['rss_hwm_mib']} MiB "
            f"[limit {MEMORY_LIMIT_MIB} MiB: {'ok' if ok_rss else 'FAIL'}]"
        )
        print(
            f"valid reviews meanwhile: {reviews.get('reviews')} over {args.reviewers} keep-alive "
            f"connections, p50 {reviews.get('p50_ms')} ms, p99 {reviews.get('p99_ms')} ms, "
            f"max {reviews.get('max_ms')} ms, reconnects {reviews.get('reconnects')} "
            f"{reviews.get('errors')} [p99 < {P99_TARGET_MS:g} ms: {'ok' if ok_p99 else 'FAIL'}]"
        )
        print(
            f"  while the attack's connections were opened: {reviews.get('opening_reviews')} "
            f"reviews, p99 {reviews.get('opening_p99_ms')} ms; while they were held: "
            f"{reviews.get('holding_reviews')} reviews, p99 {reviews.get('holding_p99_ms')} ms"
        )
        if args.fresh:
            print(
                f"fresh clients (a new connection per review): {fresh.get('reviews')} reviews "
                f"over {args.fresh} clients, p50 {fresh.get('p50_ms')} ms, p99 "
                f"{fresh.get('p99_ms')} ms, max {fresh.get('max_ms')} ms, failed "
                f"{fresh.get('failed')} {fresh.get('errors')} "
                f"[p99 < {FRESH_P99_TARGET_MS:g} ms: {'ok' if ok_fresh else 'FAIL'}]"
            )
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
