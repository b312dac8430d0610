"""The stdout sink in a real ``holdwarden serve``: every refusal is one whole JSON line on
standard output marked ``"audit": true``, the server's own logs stay on stderr, and the two
streams mixed as ``kubectl logs`` shows them read back through ``holdwarden audit --log -``
as exactly the refusals.

The child's stdout and stderr go to files (a pipe nobody drains would block it).
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.controlplane.test_audit_durability import write_certs
from tests.support.audit_helpers import eventually_async
from tests.support.review_samples import review, trainjob

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 90.0
CONNECTIONS = 8
PER_CONNECTION = 25


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, int, Path, Path, Path]:
    ca = write_certs(tmp_path / "tls")
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    audit_log = tmp_path / "audit" / "audit.jsonl"
    command = [sys.executable, "-m", "holdwarden.cli", "serve",
               "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
               "--cert-dir", str(tmp_path / "tls"), "--audit-log", str(audit_log),
               "--audit-sink", "stdout"]  # fmt: skip
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=stdout, stderr=stderr)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        for line in err.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("msg") == "serving":
                port = int(entry["listen"].rpartition(":")[2])
                metrics = int(entry["metrics"].rpartition(":")[2])
                return proc, port, metrics, ca, out, err
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"holdwarden serve did not start: {err.read_text()[-3000:]}")


async def _refuse_many(port: int, ca: Path) -> list[str]:
    context = ssl.create_default_context(cafile=str(ca))
    answered: list[str] = []
    timeout = aiohttp.ClientTimeout(total=20)

    async def connection(n: int) -> None:
        connector = aiohttp.TCPConnector(ssl=context, limit=1)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for i in range(PER_CONNECTION):
                req = review(
                    old=trainjob(suspend=True, instance="5"),
                    new=trainjob(suspend=False, instance="5"),
                    uid=f"c{n}-{i}",
                    dry_run=i % 5 == 0,
                    # Long, multi-byte names: lines of several KiB, written concurrently.
                    name=f"job-{'é' * 200}",
                )
                async with session.post(f"https://127.0.0.1:{port}/validate", json=req) as r:
                    body: Any = await r.json()
                assert body["response"]["allowed"] is False
                answered.append(body["response"]["uid"])

    await asyncio.gather(*(connection(n) for n in range(CONNECTIONS)))
    return answered


async def _metric(port: int, name: str) -> float:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{name} not exported")


async def test_stdout_sink_lines_are_whole_marked_and_read_back_from_mixed_logs(
    tmp_path: Path,
) -> None:
    proc, port, metrics_port, ca, out, err = await asyncio.to_thread(_start, tmp_path)
    try:
        async with asyncio.timeout(BUDGET):
            answered = await _refuse_many(port, ca)
            written = 'holdwarden_webhook_audit_stdout_lines_total{outcome="written"}'

            # A refusal is answered once its line is written or after STDOUT_WAIT (1 s), so
            # on a starved machine the last batch may still be on its way: poll, bounded.
            async def all_written() -> bool:
                return await _metric(metrics_port, written) >= len(answered)

            await eventually_async(
                all_written, 10, lambda: f"fewer than {len(answered)} lines written", 0.1
            )
            assert await _metric(metrics_port, written) == len(answered)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
    assert proc.returncode == 0, err.read_text()[-3000:]

    # stdout: only audit lines, each whole, marked first; every answered refusal is there.
    data = out.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert all(line.startswith(b'{"audit":true,') for line in lines), lines[:3]
    records = [json.loads(line) for line in lines]
    assert sorted(r["uid"] for r in records) == sorted(answered)
    assert {r["rule"] for r in records} == {"held-trainjob-suspended"}
    assert sum(r["dryRun"] for r in records) == CONNECTIONS * len(range(0, PER_CONNECTION, 5))
    # stderr: the server's logs, none of them an audit record; the file sink is off.
    logs = [json.loads(line) for line in err.read_text().splitlines() if line.strip()]
    assert logs and all("audit" not in entry and "logger" in entry for entry in logs)
    assert sum(entry["msg"] == "refused" for entry in logs) == len(answered)
    assert not (tmp_path / "audit" / "audit.jsonl").exists()

    # As `kubectl logs` shows them: both streams interleaved, line by line.
    err_lines = err.read_bytes().split(b"\n")[:-1]
    mixed = b"".join(
        line + b"\n" for pair in zip(err_lines, lines, strict=False) for line in pair
    ) + b"".join(line + b"\n" for line in [*err_lines[len(lines) :], *lines[len(err_lines) :]])
    assert mixed.count(b"\n") == len(err_lines) + len(lines)
    read = subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "audit", "--log", "-", "-o", "json"],
        cwd=ROOT, input=mixed, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    back = [json.loads(line) for line in read.stdout.splitlines()]
    assert sorted(r["uid"] for r in back) == sorted(answered)
    assert all("audit" not in r for r in back)
    table = subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "audit", "--log", "-", "--name", "nothing"],
        cwd=ROOT, input=mixed, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert table.returncode == 0 and table.stdout.decode().split() == [
        "TIME", "RULE", "NAMESPACE", "NAME", "INSTANCE", "USER", "OPERATION", "DRYRUN",
    ]  # fmt: skip
