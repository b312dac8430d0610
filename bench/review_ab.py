"""This tree's enforcer against another checkout's, side by side, beside the floor (a script).

    git worktree add /tmp/baseline <rev>
    .venv/bin/python bench/review_ab.py /tmp/baseline [--rounds 40] [--per-round 300]
        [--size 20000] [--uvloop]

Three servers in their own processes, all pinned to the same core, with the image's malloc
settings: this tree's enforcer (``new``), the baseline checkout's enforcer (``baseline``,
started from that checkout's own ``bench/webhook_bench.py``) and this tree's aiohttp floor.
This process, on the other core, sends allowed UPDATE reviews of about ``--size`` bytes
(bench/large_review_bench.py's TrainJob) over one keep-alive TLS connection per round and
server, visiting the three in an order that turns every round. It prints, per server, the
median server CPU per review (schedstat) and the median and quartiles of its per-round
ratio to the floor, then the median per-round ratio new / baseline. Many short rounds,
because one round's CPU time moves by 10-20 % on a busy VM; a change is judged by the
per-round ratio, not by two numbers from different runs.

``--uvloop`` adds two more servers to every round: this tree's enforcer and floor on
uvloop's event loop (``new+uvloop``, ``floor+uvloop``); their ratios are to the default
loop's floor, and ``new+uvloop / new`` says what uvloop changes for the enforcer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.large_review_bench import body_of, cpu_seconds, send  # noqa: E402
from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import http_request, image_malloc_env  # noqa: E402


def start(
    tree: Path, role: str, certs: Path, cpu: int, *, uvloop: bool = False
) -> tuple[subprocess.Popen[str], int]:
    """``role`` served by ``tree``'s own bench server, pinned to ``cpu`` (on uvloop's event
    loop if ``uvloop``); its port."""
    command = [sys.executable, str(tree / "bench" / "webhook_bench.py"), "--serve", role]
    command += ["--cert-dir", str(certs), "--work", str(certs), "--cpu", str(cpu)]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tree,
        env={
            **os.environ,
            **image_malloc_env(),
            "WEBHOOK_BENCH_LOOP": "uvloop" if uvloop else "asyncio",
        },
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise SystemExit(f"{tree}: the {role} server did not start (run it by hand to see why)")
    return proc, int(line)


def quartiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path, help="another checkout of holdwarden")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--size", type=int, default=20_000, help="review size in bytes")
    parser.add_argument("--uvloop", action="store_true", help="also serve on uvloop's loop")
    args = parser.parse_args()
    if not (args.baseline / "bench" / "webhook_bench.py").is_file():
        raise SystemExit(
            f"{args.baseline} is not a holdwarden checkout (no bench/webhook_bench.py)"
        )
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0]
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[1]})
    request = http_request(body_of(args.size))
    with tempfile.TemporaryDirectory(prefix="holdwarden-ab-") as tmp:
        certs = Path(tmp)
        context = write_serving_tls(certs)
        servers = {
            "new": start(ROOT, "enforcer", certs, server_cpu),
            "baseline": start(args.baseline.resolve(), "enforcer", certs, server_cpu),
            "floor": start(ROOT, "floor", certs, server_cpu),
        }
        if args.uvloop:
            servers["new+uvloop"] = start(ROOT, "enforcer", certs, server_cpu, uvloop=True)
            servers["floor+uvloop"] = start(ROOT, "floor", certs, server_cpu, uvloop=True)
        per_review: dict[str, list[float]] = {name: [] for name in servers}
        try:
            for _, port in servers.values():  # warm-up
                asyncio.run(send(port, context, request, 50))
            names = list(servers)
            for round_ in range(args.rounds):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    proc, port = servers[name]
                    before = cpu_seconds(proc.pid)
                    asyncio.run(send(port, context, request, args.per_round))
                    time.sleep(0.02)  # the last answer's bookkeeping
                    used = cpu_seconds(proc.pid) - before
                    per_review[name].append(used / args.per_round * 1e6)
        finally:
            for proc, _ in servers.values():
                proc.kill()
                proc.wait()
    print(
        f"{len(request)} B reviews, {args.rounds} rounds x {args.per_round}, server CPU per review"
    )
    floor = per_review["floor"]
    for name, values in per_review.items():
        ratios = [v / f for v, f in zip(values, floor, strict=True)]
        low, high = quartiles(ratios)
        print(
            f"  {name:12} {statistics.median(values):7.1f} us; / floor: median "
            f"{statistics.median(ratios):.3f} (quartiles {low:.2f}-{high:.2f})"
        )
    pairs = [("new", "baseline"), ("new+uvloop", "new"), ("floor+uvloop", "floor")]
    for top, bottom in pairs:
        if top not in per_review:
            continue
        change = [n / b for n, b in zip(per_review[top], per_review[bottom], strict=True)]
        low, high = quartiles(change)
        print(
            f"  {top} / {bottom}: median {statistics.median(change):.3f} "
            f"(quartiles {low:.2f}-{high:.2f})"
        )


if __name__ == "__main__":
    main()
