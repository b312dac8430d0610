"""The audit log's disk budget: rotation by size and count, and reading across rotations."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from holdwarden.config import Config, ConfigError
from holdwarden.webhook.audit import (
    MAX_LINE_BYTES,
    AuditWriter,
    audit_files,
    encode_line,
    read_audit,
    rotated_path,
)
from tests.support.audit_helpers import assert_whole_lines, record

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 16 * 1024
MAX_FILES = 3


def on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in audit_files(path) if p.exists())


async def test_rotation_keeps_the_budget_and_the_newest_lines(tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        path = tmp_path / "audit.jsonl"
        writer = AuditWriter(path, fsync=False, max_bytes=MAX_BYTES, max_files=MAX_FILES)
        writer.open()
        line_size = len(encode_line(record("u0000")))
        total = 20 * MAX_BYTES // line_size  # twenty files' worth, far over the budget
        try:
            for start in range(0, total, 25):  # batches of 25 concurrent lines
                await asyncio.gather(
                    *(writer.append(record(f"u{i:04}")) for i in range(start, start + 25))
                )
                assert on_disk(path) <= MAX_BYTES * (MAX_FILES + 1)
        finally:
            await writer.aclose()
        files = audit_files(path)
        assert [p.name for p in files] == [
            "audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3",
        ]  # fmt: skip
        for file in files:
            assert file.stat().st_size <= MAX_BYTES
            assert_whole_lines(file)
        assert writer.rotations >= 15
        uids = [r["uid"] for r in read_audit(path).records]
        # Oldest first across the files, no gap, ending with the newest line written.
        last = total + (-total % 25) - 1
        assert uids == [f"u{i:04}" for i in range(last - len(uids) + 1, last + 1)]
        assert len(uids) * line_size > MAX_FILES * MAX_BYTES  # the budget was used


async def test_a_batch_larger_than_a_file_is_split_at_line_boundaries(tmp_path: Path) -> None:
    async with asyncio.timeout(30):
        path = tmp_path / "audit.jsonl"
        writer = AuditWriter(path, fsync=False, max_bytes=MAX_LINE_BYTES, max_files=5)
        writer.open()
        try:
            big = record("x", message="m" * 3000)  # ~3.3 KB: two fit in one 8 KiB file
            await asyncio.gather(*(writer.append({**big, "uid": f"b{i}"}) for i in range(6)))
        finally:
            await writer.aclose()
        assert writer.batches <= 2  # one group commit (plus at most the first line's)
        assert [r["uid"] for r in read_audit(path).records] == [f"b{i}" for i in range(6)]
        for file in audit_files(path):
            assert file.stat().st_size <= MAX_LINE_BYTES
            assert_whole_lines(file)


def test_reader_skips_duplicates_and_non_numeric_copies(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(encode_line(record("3")))
    rotated_path(path, 1).write_bytes(encode_line(record("2")))
    rotated_path(path, 10).write_bytes(encode_line(record("1")))
    (tmp_path / "audit.jsonl.2.gz").write_bytes(b"\x1f\x8b not read")
    (tmp_path / "audit.jsonl-20261202").write_bytes(b"not read")
    os.link(path, tmp_path / "audit.jsonl.7")  # the same file under two names: read once
    result = read_audit(path)
    assert [r["uid"] for r in result.records] == ["1", "2", "3"]
    assert result.skipped == 0


def run_audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "audit", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_audit_cli_reads_rotated_files_and_names_the_file_of_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    rotated_path(path, 2).write_bytes(encode_line(record("a")) + b"torn\n")
    rotated_path(path, 1).write_bytes(encode_line(record("b")))
    path.write_bytes(encode_line(record("c", namespace="other")))
    out = run_audit("--log", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["uid"] for x in out.stdout.splitlines()] == ["a", "b", "c"]
    assert "skipped 1 unreadable line" in out.stderr and "audit.jsonl.2:2" in out.stderr
    table = run_audit("--log", str(path), "--namespace", "ns")
    assert table.returncode == 0 and len(table.stdout.splitlines()) == 3


def test_config_keys_for_the_budget() -> None:
    hook = Config.from_dict({"webhook": {"auditMaxBytes": 1048576, "auditMaxFiles": 2}}).webhook
    assert (hook.audit_max_bytes, hook.audit_max_files) == (1048576, 2)
    defaults = Config().webhook
    # The defaults fit the Deployment's 1 GiB emptyDir with room to spare.
    assert defaults.audit_max_bytes * (defaults.audit_max_files + 1) <= 700 * 1024 * 1024
    for bad in ({"auditMaxBytes": 1000}, {"auditMaxFiles": 0}, {"auditMaxFiles": "3"}):
        with pytest.raises(ConfigError) as caught:
            Config.from_dict({"webhook": bad})
        assert caught.value.key == f"webhook.{next(iter(bad))}"


def test_enforcer_server_uses_the_budget(tmp_path: Path) -> None:
    from holdwarden.cli.enforcer import EnforcerServer

    config = Config.from_dict(
        {
            "webhook": {
                "auditLog": str(tmp_path / "a.jsonl"),
                "auditMaxBytes": 65536,
                "auditMaxFiles": 7,
            }
        }
    )
    server = EnforcerServer(config)
    assert (server.audit.max_bytes, server.audit.max_files) == (65536, 7)
