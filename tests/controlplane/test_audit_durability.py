"""The audit trail survives ``kill -9`` under load, and ``holdwarden audit`` reads it back.

A real ``holdwarden serve`` process (TLS, real fsync) is driven with refusals from many
concurrent connections and killed with SIGKILL mid-load. Every refusal the client received
must then be in the log, and every line but at most a torn last one must parse.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.webhook.audit import AuditWriter, encode_line, read_audit
from holdwarden.webhook.cli import parse_since
from tests.support.review_samples import review, trainjob, workload

ROOT = Path(__file__).resolve().parents[2]


def write_certs(cert_dir: Path) -> Path:
    ca = generate_ca()
    leaf = generate_serving(ca, "holdwarden", "holdwarden-system", ip_addresses=["127.0.0.1"])
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(leaf.cert_pem)
    (cert_dir / "tls.key").write_bytes(leaf.key_pem)
    (cert_dir / "ca.crt").write_bytes(ca.cert_pem)
    return cert_dir / "ca.crt"


def serve_args(tmp_path: Path, audit_log: Path) -> list[str]:
    """``holdwarden serve`` on free ports, with the certificates in ``tmp_path/tls``."""
    return [
        "serve",
        "--listen", "127.0.0.1:0",
        "--metrics", "127.0.0.1:0",
        "--cert-dir", str(tmp_path / "tls"),
        "--audit-log", str(audit_log),
    ]  # fmt: skip


def start_serve(
    tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], int, int, Path, Path]:
    """``holdwarden serve`` (``serve_args``, then ``extra``) until it logs "serving"."""
    ca = write_certs(tmp_path / "tls")
    audit_log = tmp_path / "audit" / "audit.jsonl"
    # Logs go to a file: a pipe nobody drains would block the server once full.
    log_path = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "holdwarden.cli", *serve_args(tmp_path, audit_log), *extra],
        cwd=ROOT,
        stderr=log_path.open("wb"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log_path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line still being written (or not ours): look again next time
            if entry.get("msg") == "serving":
                port = int(entry["listen"].rpartition(":")[2])
                metrics_port = int(entry["metrics"].rpartition(":")[2])
                return proc, port, metrics_port, audit_log, ca
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"holdwarden serve did not start: {log_path.read_text()}")


async def drive(port: int, ca: Path, answered: list[str], stop: asyncio.Event) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    connector = aiohttp.TCPConnector(ssl=context, limit=64)
    errors = 0

    async def worker(n: int) -> None:
        nonlocal errors
        i = 0
        async with aiohttp.ClientSession(connector=connector, connector_owner=False) as session:
            while not stop.is_set():
                i += 1
                req = review(
                    old=trainjob(suspend=True, instance="5"),
                    new=trainjob(suspend=False, instance="5"),
                    uid=f"w{n}-{i}",
                    dry_run=bool(i % 2),
                )
                try:
                    async with session.post(
                        f"https://127.0.0.1:{port}/validate", json=req
                    ) as response:
                        body = await response.json()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    errors += 1
                    await asyncio.sleep(0.01)
                    continue
                assert body["response"]["allowed"] is False
                answered.append(body["response"]["uid"])

    await asyncio.gather(*(worker(n) for n in range(32)))
    await connector.close()
    return errors


async def test_kill_9_under_load_loses_no_answered_refusal(tmp_path: Path) -> None:
    proc, port, metrics_port, audit_log, ca = start_serve(tmp_path)
    answered: list[str] = []
    stop = asyncio.Event()
    try:
        load = asyncio.create_task(drive(port, ca, answered, stop))
        deadline = time.monotonic() + 120
        while len(answered) < 1500:
            await asyncio.sleep(0.05)
            assert time.monotonic() < deadline, f"only {len(answered)} answers in 120s"
            assert not load.done(), load
        # The metrics port is up too, and counts the refusals.
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                assert "holdwarden_webhook_reviews_total" in await response.text()
            async with session.get(f"http://127.0.0.1:{metrics_port}/readyz") as response:
                assert response.status == 200
        os.kill(proc.pid, signal.SIGKILL)  # mid-load: requests are in flight
        proc.wait(timeout=10)
        stop.set()
        await load
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    logged = read_audit(audit_log)
    lines = audit_log.read_bytes().split(b"\n")
    # Only the last line may be torn (a batch cut by the kill; none of it was answered).
    assert logged.skipped <= 1
    if logged.skipped:
        assert logged.skipped_lines == [len([x for x in lines if x.strip()])]
    uids = {record["uid"] for record in logged.records}
    missing = [uid for uid in answered if uid not in uids]
    assert len(answered) >= 1500
    assert missing == [], f"{len(missing)} answered refusals are not in the audit log"
    for record in logged.records:
        assert record["rule"] == "held-trainjob-suspended"
        assert record["dryRun"] is (int(record["uid"].rpartition("-")[2]) % 2 == 1)

    # A restarted writer starts on a fresh line, so a torn tail never corrupts new records.
    with open(audit_log, "ab") as handle:
        handle.write(b'{"time":"2026-12-02T12:00:00Z","uid":"torn')
    writer = AuditWriter(audit_log)
    writer.open()
    await writer.append({"time": "2026-12-02T12:00:01Z", "uid": "after-restart", "rule": "x"})
    writer.close()
    again = read_audit(audit_log)
    assert again.records[-1]["uid"] == "after-restart"
    assert again.skipped == logged.skipped + 1


async def test_group_commit_batches_concurrent_appends(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "a.jsonl")
    writer.open()
    await asyncio.gather(*(writer.append({"uid": str(i), "rule": "r"}) for i in range(500)))
    writer.close()
    records = read_audit(tmp_path / "a.jsonl").records
    assert sorted(int(r["uid"]) for r in records) == list(range(500))
    assert writer.lines == 500
    assert writer.batches < 500  # many lines shared one write+fsync


async def test_append_after_close_fails_loudly(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "a.jsonl")
    writer.open()
    writer.close()
    with pytest.raises(OSError):
        await writer.append({"uid": "late"})


def test_encode_line_is_one_line() -> None:
    line = encode_line({"message": "a\nb\u2028c", "uid": "x"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["message"] == "a\nb\u2028c"


def _record(**fields: Any) -> dict[str, Any]:
    base = {
        "time": "2026-12-02T12:00:00.000000Z",
        "uid": "u",
        "dryRun": False,
        "rule": "held-trainjob-suspended",
        "message": "m",
        "user": "alice",
        "groups": [],
        "operation": "UPDATE",
        "resource": "trainjobs",
        "namespace": "ns",
        "name": "job",
        "instance": "3",
    }
    base.update(fields)
    return base


def test_read_audit_filters_and_skips_garbage(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(
        encode_line(_record(uid="1"))
        + encode_line(_record(uid="2", namespace="other", time="2026-12-02T13:00:00Z"))
        + b"not json\n"
        + encode_line(_record(uid="3", user="bob", rule="kueue-owns-suspend"))
        + b"[1,2]\n"
        + encode_line(_record(uid="4", name="job2"))
        + b'{"uid": "5", "ti'
    )
    everything = read_audit(path)
    assert [r["uid"] for r in everything.records] == ["1", "2", "3", "4"]
    assert everything.skipped == 3 and everything.skipped_lines == [3, 5, 7]
    assert [r["uid"] for r in read_audit(path, namespace="ns").records] == ["1", "3", "4"]
    assert [r["uid"] for r in read_audit(path, name="job2").records] == ["4"]
    assert [r["uid"] for r in read_audit(path, user="bob").records] == ["3"]
    assert [r["uid"] for r in read_audit(path, rule="kueue-owns-suspend").records] == ["3"]
    since = parse_since("2026-12-02T12:30:00Z", datetime.now(UTC))
    assert parse_since("1h", since) == datetime(2026, 12, 2, 11, 30, tzinfo=UTC)
    assert [r["uid"] for r in read_audit(path, since=since).records] == ["2"]
    assert read_audit(tmp_path / "missing.jsonl").records == []


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "audit", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_audit_cli_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(
        encode_line(_record(uid="1", dryRun=True))
        + encode_line(_record(uid="2", namespace="other", rule="hold-instance-monotonic"))
        + b'{"torn'
    )
    table = run_cli("--log", str(path), "--namespace", "ns")
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split() == [
        "TIME", "RULE", "NAMESPACE", "NAME", "INSTANCE", "USER", "OPERATION", "DRYRUN",
    ]  # fmt: skip
    assert len(rows) == 2 and "held-trainjob-suspended" in rows[1] and "true" in rows[1]
    assert "skipped 1 unreadable line" in table.stderr

    as_json = run_cli("--log", str(path), "--json", "--rule", "hold-instance-monotonic")
    assert as_json.returncode == 0
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [line["uid"] for line in lines] == ["2"]

    recent = run_cli("--log", str(path), "--json", "--since", "10m")
    assert recent.returncode == 0 and recent.stdout == ""  # records are from the past
    bad = run_cli("--log", str(path), "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_workload_record_fields() -> None:
    # The workload review builder is also used by the benchmark; keep it honest.
    body = review(resource="workloads", old=workload(active=False), new=workload())
    assert body["request"]["resource"]["resource"] == "workloads"
    assert body["request"]["object"]["spec"]["podSets"][0]["count"] == 1


def test_serve_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc, *_ = start_serve(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    entries = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines()]
    assert [e["msg"] for e in entries if e["msg"] in ("serving", "stopping")] == [
        "serving",
        "stopping",
    ]
    assert all({"time", "level", "logger", "msg"} <= set(e) for e in entries)
    # webhook.eventLoop's default, as the process runs it.
    assert next(e for e in entries if e["msg"] == "serving")["eventLoop"] == "uvloop"


def test_serve_runs_on_the_event_loop_webhook_event_loop_names(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("webhook:\n  eventLoop: asyncio\n")
    proc, *_ = start_serve(tmp_path, "--config", str(tmp_path / "config.yaml"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    entries = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines()]
    assert next(e for e in entries if e["msg"] == "serving")["eventLoop"] == "asyncio"


# Run in a child: SIGTERM to itself while the server is still starting. Were the handlers
# installed only after start, the default action would kill it (-15), as it once did in
# CI when the test above sent SIGTERM right after "serving".
SIGTERM_DURING_START = """
import os, signal, sys
import holdwarden.cli.enforcer as server
original_start = server.EnforcerServer.start
async def start_after_sigterm(self):
    os.kill(os.getpid(), signal.SIGTERM)
    await original_start(self)
server.EnforcerServer.start = start_after_sigterm
from holdwarden.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_starting_still_drains_and_exits_zero(tmp_path: Path) -> None:
    write_certs(tmp_path / "tls")
    config = tmp_path / "config.yaml"
    config.write_text("webhook:\n  shutdownDelay: 0s\n")
    audit_log = tmp_path / "audit.jsonl"
    command = [sys.executable, "-c", SIGTERM_DURING_START, *serve_args(tmp_path, audit_log)]
    done = subprocess.run(
        [*command, "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    messages = [json.loads(line)["msg"] for line in done.stderr.splitlines()]
    assert messages.index("serving") < messages.index("stopping") < messages.index("drained")


async def test_concurrent_appends_share_one_batch_and_aclose_waits(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "a.jsonl")
    writer.open()
    await writer.append({"uid": "first"})
    assert writer.batches == 1
    # Queued while nothing is in flight: all 50 go out in one write + one fdatasync.
    tasks = [asyncio.create_task(writer.append({"uid": str(i)})) for i in range(50)]
    await asyncio.sleep(0)
    await writer.aclose()
    await asyncio.gather(*tasks)
    assert writer.batches == 2 and writer.lines == 51
    assert len(read_audit(tmp_path / "a.jsonl").records) == 51
