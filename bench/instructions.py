"""Instructions per review under callgrind, for servers side by side (a script).

    .venv/bin/python bench/instructions.py [OTHER_CHECKOUT ...] [--reviews 300]
        [--size 20000] [--uvloop] [--annotate DIR]

Each server (this tree's enforcer and aiohttp floor, and the enforcer of every other
checkout named, started from that checkout's own ``bench/webhook_bench.py``) runs under
``valgrind --tool=callgrind`` in its own process. This process sends 30 warm-up reviews
over one keep-alive TLS connection, zeroes the counters (``callgrind_control -z``), sends
``--reviews`` allowed UPDATE reviews of about ``--size`` bytes (bench/large_review_bench.py's
TrainJob) on the same connection, and dumps them (``callgrind_control -d``). It prints each
server's instructions per review and its ratio to the floor.

Why: an instruction count does not move with the machine's load, where CPU time moves by
10-30 % from one run to the next on a shared VM, so a change of a few per cent can be seen
on a busy machine. It is not time: cache misses and the kernel's share (system calls,
TLS's socket work) are not in it, so confirm a change that matters with
``bench/review_ab.py`` on quiet cores. ``--annotate DIR`` keeps each dump there for
``callgrind_annotate``. ``--uvloop`` serves the enforcer and the floor of this tree on
uvloop's event loop as well.

Each server starts in 1-3 minutes under callgrind (its imports run ~50 times slower).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.large_review_bench import body_of, send  # noqa: E402
from bench.tlsfixture import write_serving_tls  # noqa: E402
from bench.webhook_bench import http_request, image_malloc_env  # noqa: E402

WARM_UP = 30
START_TIMEOUT_S = 600.0
_TOTALS = re.compile(rb"^(?:totals|summary): *([0-9]+)", re.MULTILINE)


def callgrind_totals(dump: Path) -> int:
    """The instruction count (the first event, Ir) a callgrind dump records."""
    found = _TOTALS.search(dump.read_bytes())
    if found is None:
        raise RuntimeError(f"{dump}: no totals line (is it a callgrind dump?)")
    return int(found.group(1))


class Server:
    """``role`` of ``tree``'s bench server under callgrind, dumping into ``out``."""

    def __init__(self, tree: Path, role: str, certs: Path, out: Path, *, uvloop: bool) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out.%p",
            sys.executable, str(tree / "bench" / "webhook_bench.py"), "--serve", role,
            "--cert-dir", str(certs), "--work", str(out),
        ]  # fmt: skip
        env = {
            **os.environ,
            **image_malloc_env(),
            "WEBHOOK_BENCH_LOOP": "uvloop" if uvloop else "asyncio",
        }
        self.log = (out / "valgrind.log").open("w")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=tree, env=env
        )
        assert self.proc.stdout is not None
        line = _readline_within(self.proc, START_TIMEOUT_S)
        if not line.strip().isdigit():
            self.stop()
            raise SystemExit(f"{tree}: {role} did not start under callgrind: see {out}")
        self.port = int(line)

    def control(self, *flags: str) -> None:
        subprocess.run(
            ["callgrind_control", *flags, str(self.proc.pid)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def dumps(self) -> list[Path]:
        return sorted(self.out.glob(f"callgrind.out.{self.proc.pid}*"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def _readline_within(proc: subprocess.Popen[str], timeout: float) -> str:
    """The server's first line (its port), or "" if it printed none within ``timeout``."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if line:
            return line
        time.sleep(0.2)
    return ""


def measure(server: Server, context: ssl.SSLContext, request: bytes, reviews: int) -> float:
    """Instructions per review of ``reviews`` reviews, counted between a zero and a dump."""
    asyncio.run(send(server.port, context, request, WARM_UP))
    before = set(server.dumps())
    server.control("-z")
    asyncio.run(send(server.port, context, request, reviews))
    server.control("-d")
    new = [d for d in server.dumps() if d not in before]
    if not new:
        raise RuntimeError(f"callgrind wrote no dump into {server.out}")
    return callgrind_totals(new[-1]) / reviews


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("others", type=Path, nargs="*", help="other checkouts of holdwarden")
    parser.add_argument("--reviews", type=int, default=300)
    parser.add_argument("--size", type=int, default=20_000, help="review size in bytes")
    parser.add_argument("--uvloop", action="store_true", help="also serve on uvloop's loop")
    parser.add_argument("--annotate", type=Path, help="keep the callgrind dumps here")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    for other in args.others:
        if not (other / "bench" / "webhook_bench.py").is_file():
            raise SystemExit(f"{other} is not a holdwarden checkout (no bench/webhook_bench.py)")
    request = http_request(body_of(args.size))
    servers = [("floor", ROOT, "floor", False), ("enforcer", ROOT, "enforcer", False)]
    if args.uvloop:
        servers += [
            ("floor+uvloop", ROOT, "floor", True),
            ("enforcer+uvloop", ROOT, "enforcer", True),
        ]
    servers += [(f"enforcer@{o}", o.resolve(), "enforcer", False) for o in args.others]
    counts: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="holdwarden-callgrind-") as tmp:
        certs = Path(tmp) / "certs"
        certs.mkdir()
        context = write_serving_tls(certs)
        keep = args.annotate or Path(tmp)
        for index, (name, tree, role, uvloop) in enumerate(servers):
            server = Server(tree, role, certs, keep / f"{index}-{role}", uvloop=uvloop)
            try:
                counts[name] = measure(server, context, request, args.reviews)
            finally:
                server.stop()
            print(f"  {name}: {counts[name]:,.0f} instructions per review", flush=True)
    print(f"{len(request)} B reviews, {args.reviews} per server, instructions per review:")
    floor = counts["floor"]
    for name, count in counts.items():
        line = f"  {name:40} {count:12,.0f}   / floor {count / floor:.3f}"
        if name == "enforcer+uvloop":
            line += f", / floor+uvloop {count / counts['floor+uvloop']:.3f}"
        print(line)
    if args.annotate:
        print(f"dumps kept in {args.annotate} (callgrind_annotate FILE)")


if __name__ == "__main__":
    main()
