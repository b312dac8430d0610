"""A burst of AdmissionReviews, each on its own new TLS connection (a script, not a test).

    .venv/bin/python bench/burst_probe.py [--burst 1000] [--rounds 3] [--baseline 300]

(``WEBHOOK_BENCH_LOOP=uvloop`` in the environment serves on uvloop's event loop.)

It starts ``EnforcerServer`` with the shipped defaults (``webhook.maxConnections`` 300, ...)
in its own process, as ``bench/connection_probe.py`` does. A loader in another process
then opens ``--burst`` TLS connections at once and sends one valid review on each, the way
several kube-apiservers under a write burst do when they open new connections. Each
review's latency runs from its connect to its answer; a review counts as failed if it gets
no answer within 10 s (the apiserver's default webhook timeout) or its connection is closed
or reset.

Side by side in each round (the order turns every round): the burst, and a baseline burst
of ``--baseline`` reviews, which the cap admits without any waiting. It prints, per burst
size, the median over the rounds of p50 and p99 latency, the time until the last review
is answered (the drain), failures, and the server's peak RSS (VmHWM). Targets: every one of
the burst answered within 10 s, and peak RSS under the Deployment's 256 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.connection_probe import MEMORY_LIMIT_MIB, rss_mib  # noqa: E402
from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import build_bodies, http_request, percentile  # noqa: E402

WEBHOOK_TIMEOUT_S = 10.0


def burst(port: int, ca: Path, size: int) -> dict[str, Any]:
    """Open ``size`` connections at once, one review on each; latencies and failures."""
    request = next(http_request(body) for body, refuse in build_bodies(4) if not refuse)
    context = ssl.create_default_context(cafile=str(ca))
    latencies: list[float] = []
    failures: dict[str, int] = {}

    async def one() -> None:
        started = time.perf_counter()
        writer = None
        try:
            async with asyncio.timeout(WEBHOOK_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
                )
                writer.write(request)
                status = await reader.readline()
                if not status.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"status {status[:40]!r}")
                await reader.readuntil(b"\r\n\r\n")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, RuntimeError) as exc:
            name = type(exc).__name__
            failures[name] = failures.get(name, 0) + 1
            return
        finally:
            if writer is not None:
                writer.close()
        latencies.append(time.perf_counter() - started)

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(size)))
        return time.perf_counter() - began

    drain = asyncio.run(main())
    return {
        "size": size,
        "answered": len(latencies),
        "failures": failures,
        "p50_ms": percentile(latencies, 0.5) * 1000 if latencies else None,
        "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else None,
        "drain_s": drain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--baseline", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--load", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(json.dumps(burst(args.port, args.ca, args.load)), flush=True)
        return

    runs: dict[int, list[dict[str, Any]]] = {args.burst: [], args.baseline: []}
    with tempfile.TemporaryDirectory(prefix="holdwarden-burst-") as tmp:
        work = Path(tmp)
        write_serving_tls(work, namespace="probe")
        probe = ROOT / "bench" / "connection_probe.py"
        command = [sys.executable, str(probe), "--serve", "--cert-dir", str(work)]
        command += ["--work", str(work)]
        log = (work / "server.log").open("w")
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            if not line.strip().isdigit():
                raise SystemExit(f"server did not start: {(work / 'server.log').read_text()}")
            port = int(line)
            for round_ in range(args.rounds):
                order = [args.burst, args.baseline]
                if round_ % 2:
                    order.reverse()
                for size in order:
                    loader = subprocess.run(
                        [sys.executable, __file__, "--load", str(size), "--port", str(port),
                         "--ca", str(work / "ca.crt")],
                        capture_output=True, text=True, cwd=ROOT, timeout=120,
                    )  # fmt: skip
                    runs[size].append(json.loads(loader.stdout))
                    time.sleep(1)  # let the connections' TLS shutdowns finish
            peak = rss_mib(server.pid, "VmHWM:")
        finally:
            server.kill()
            server.wait()

    def median(size: int, key: str) -> float:
        values = [r[key] for r in runs[size] if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    report = {
        "rounds": args.rounds,
        "peak_rss_mib": round(peak, 1),
        "bursts": {
            str(size): {
                "answered": [r["answered"] for r in runs[size]],
                "failures": [r["failures"] for r in runs[size]],
                "p50_ms": round(median(size, "p50_ms"), 1),
                "p99_ms": round(median(size, "p99_ms"), 1),
                "drain_s": round(median(size, "drain_s"), 2),
                "drain_max_s": round(max(r["drain_s"] for r in runs[size]), 2),
            }
            for size in runs
        },
    }
    big = report["bursts"][str(args.burst)]
    base = report["bursts"][str(args.baseline)]
    report["p99_ratio"] = round(big["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None
    report["pass"] = (
        all(a == args.burst for a in big["answered"])
        and big["drain_max_s"] < WEBHOOK_TIMEOUT_S
        and peak < MEMORY_LIMIT_MIB
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"burst probe, default serve (maxConnections 300), {args.rounds} rounds side by side")
    for size, row in report["bursts"].items():
        print(
            f"  {size:>5} at once: answered {row['answered']}, failures {row['failures']}, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, drain {row['drain_s']} s "
            f"(max {row['drain_max_s']} s)"
        )
    print(f"  p99 ratio {args.burst}/{args.baseline}: {report['p99_ratio']}")
    print(f"  server peak RSS {report['peak_rss_mib']} MiB (limit {MEMORY_LIMIT_MIB})")
    print(f"  {'PASS' if report['pass'] else 'FAIL'}")
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
