"""Server CPU per review for large AdmissionReviews, beside the aiohttp floor (a script).

    .venv/bin/python bench/large_review_bench.py [--rounds 7] [--per-round 40]

The enforcer (``EnforcerServer``, shipped defaults) and the framework floor (an aiohttp
handler on the same TLS setup that reads the body and always allows; bench/webhook_bench.py)
each run in their own process, both pinned to the same core. This process, pinned to the
other core when there is one, sends allowed UPDATE reviews of about 20 KB, 300 KB and
1.5 MB (a TrainJob grown with managedFields, a last-applied configuration and a long
trainer env, old and new object alike) over one keep-alive TLS connection each, in rounds
that visit the two servers in turn (the order turns every round). Per size it prints the
median over the rounds of the server CPU time per review (every thread's on-CPU time, from
/proc/<pid>/task/*/schedstat) and the ratio enforcer / floor, which is what the targets
are stated in: at most 1.8x for 1.5 MB and 1.5x for 10-30 KB. A third server,
``enforcer-narrow``, is the enforcer with wide reads turned off (every TLS read 32 KiB, as
before they came), so the gain is measured side by side too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import Connection, http_request, start_server  # noqa: E402
from tests.support.review_samples import inflate, review, trainjob  # noqa: E402

SIZES = {"20KB": 20_000, "300KB": 300_000, "1.5MB": 1_500_000}
ROLES = ("enforcer", "enforcer-narrow", "floor")
# Reviews per round and size, so that each round's CPU time spans many clock ticks.
WORK_BYTES_PER_ROUND = 30_000_000


def _grown(size: int, team: str | None) -> dict[str, object]:
    """A TrainJob of about ``size`` bytes: inflate()'s managedFields (it stops at 200
    managers, ~250 KB), then a trainer env long enough for the rest."""
    job = trainjob(suspend=True, instance="3", queue=True, name="big")
    if team is not None:
        job["metadata"]["labels"]["team"] = team
    job = inflate(job, size)
    env = job["spec"]["trainer"]["env"]
    j = len(env)
    while len(json.dumps(job, separators=(",", ":"))) < size:
        env.extend({"name": f"CONFIG_{k}", "value": f"shard-{k}-" * 8} for k in range(j, j + 50))
        j += 50
    return job


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of ``pid`` in nanoseconds' resolution (schedstat), not
    /proc/<pid>/stat's 10 ms clock ticks, which quantise a round of large reviews."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def body_of(size: int) -> bytes:
    doc = review(old=_grown(size // 2, None), new=_grown(size // 2, "ml"), name="big")
    return json.dumps(doc, separators=(",", ":")).encode()


async def send(port: int, context: ssl.SSLContext, request: bytes, count: int) -> None:
    conn = await Connection.open(port, context)
    try:
        for _ in range(count):
            answer = await conn.roundtrip(request)
            if b'"allowed":true' not in answer:
                raise RuntimeError(f"not allowed: {answer[:200]!r}")
    finally:
        conn.close()


def _ratio(server: list[float], floor: list[float]) -> float:
    """Median over the rounds of the round's server / floor (same round, same load)."""
    return round(statistics.median(s / f for s, f in zip(server, floor, strict=True) if f), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=20, help="at least this many")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    server_cpu = cpus[0]
    if len(cpus) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpus[1]})
    requests = {name: http_request(body_of(size)) for name, size in SIZES.items()}
    per_review: dict[str, dict[str, list[float]]] = {
        name: {role: [] for role in ROLES} for name in SIZES
    }
    with tempfile.TemporaryDirectory(prefix="holdwarden-large-") as tmp:
        work = Path(tmp)
        context = write_serving_tls(work)
        servers = {role: start_server(role, work, work, server_cpu) for role in ROLES}
        try:
            for request in requests.values():  # warm-up
                for _, port in servers.values():
                    asyncio.run(send(port, context, request, 5))
            for round_ in range(args.rounds):
                # The order turns every round, so no server always goes first.
                shift = round_ % len(ROLES)
                roles = list(ROLES[shift:] + ROLES[:shift])
                for name, request in requests.items():
                    for role in roles:
                        proc, port = servers[role]
                        before = cpu_seconds(proc.pid)
                        count = max(args.per_round, WORK_BYTES_PER_ROUND // len(request))
                        asyncio.run(send(port, context, request, count))
                        time.sleep(0.05)  # the last answer's bookkeeping
                        used = cpu_seconds(proc.pid) - before
                        per_review[name][role].append(used / count * 1e6)
        finally:
            for proc, _ in servers.values():
                proc.kill()
                proc.wait()
    report = {
        name: {
            "review_bytes": len(requests[name]),
            "enforcer_us": round(statistics.median(roles["enforcer"])),
            "narrow_us": round(statistics.median(roles["enforcer-narrow"])),
            "floor_us": round(statistics.median(roles["floor"])),
            "ratio": _ratio(roles["enforcer"], roles["floor"]),
            "narrow_ratio": _ratio(roles["enforcer-narrow"], roles["floor"]),
        }
        for name, roles in per_review.items()
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"server CPU per review, median of {args.rounds} rounds x {args.per_round} reviews")
    for name, row in report.items():
        print(
            f"  {name:>6} ({row['review_bytes']:>9} B): enforcer {row['enforcer_us']:>6} us, "
            f"narrow {row['narrow_us']:>6} us, floor {row['floor_us']:>6} us; "
            f"ratio {row['ratio']} (narrow {row['narrow_ratio']})"
        )


if __name__ == "__main__":
    main()
