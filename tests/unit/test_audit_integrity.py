"""The audit writer keeps its file whole and findable: disk full, rename, delete, reopen.

A line is whole or absent (a failed write is cut back, never glued to the next line); a
failed write fails its callers and makes the writer not writable until a write or probe
succeeds; a renamed or deleted file is reopened at the configured path.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path

import pytest

from holdwarden.webhook.audit import AuditWriter, encode_line, read_audit, rotated_path
from tests.support.audit_helpers import assert_whole_lines, eventually, fill, record, small_tmpfs

BUDGET = 30.0  # seconds for any one test


async def fill_until_refused(writer: AuditWriter, first: int = 0) -> tuple[list[str], OSError]:
    """Append records one by one until the disk refuses one; return the uids written."""
    written: list[str] = []
    for i in range(first, first + 1000):  # 64 KiB holds ~150 of these; bounded anyway
        try:
            await writer.append(record(f"r{i}"))
        except OSError as exc:
            return written, exc
        written.append(f"r{i}")
    raise AssertionError("the small file system never filled up")


async def test_disk_full_leaves_whole_lines_and_recovers(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        with small_tmpfs(tmp_path / "small") as small:
            filler = fill(small, leave=16 * 1024)
            path = small / "audit.jsonl"
            writer = AuditWriter(path, probe_interval=0.05)
            writer.open()
            try:
                written, error = await fill_until_refused(writer)
                assert error.errno == errno.ENOSPC
                assert written, "some lines fit before the disk filled"
                # The refused line was cut back: the file is whole lines only.
                assert_whole_lines(path)
                assert [r["uid"] for r in read_audit(path).records] == written
                assert writer.writable is False and writer.failed_writes >= 1
                assert "not writable" in (writer.unready_reason() or "")
                # Still full: the probe keeps failing and the writer stays unready.
                await asyncio.sleep(0.3)
                assert writer.writable is False
                # Space comes back: the probe notices without any new refusal.
                filler.unlink()
                await eventually(lambda: writer.writable, 10, lambda: str(writer.last_error))
                assert writer.unready_reason() is None
                await writer.append(record("after"))
                lines = assert_whole_lines(path)
                uids = [json.loads(line)["uid"] for line in lines if line.strip()]
                assert uids == [*written, "after"]  # nothing glued, nothing extra
                assert read_audit(path).skipped == 0
            finally:
                await writer.aclose()


async def test_short_write_then_full_is_cut_back_not_glued(tmp_path: Path) -> None:
    # The exact failure seen: a write that lands only partly (the last free page), then
    # ENOSPC. The partial bytes must not stay in the file.
    async with asyncio.timeout(BUDGET):
        with small_tmpfs(tmp_path / "small") as small:
            path = small / "audit.jsonl"
            writer = AuditWriter(path, probe_interval=0.05)
            writer.open()
            try:
                # Lines of 4000 bytes straddle the 4 KiB pages, so the last one is short.
                big = record("x", message="m" * 3700)
                ok = 0
                with pytest.raises(OSError):
                    for i in range(100):
                        await writer.append({**big, "uid": f"b{i}"})
                        ok += 1
                assert_whole_lines(path)
                assert len(read_audit(path).records) == ok
                # Free space (an operator empties the file).
                os.truncate(path, 0)
                await eventually(lambda: writer.writable, 10)
                await writer.append(record("after"))
                assert [r["uid"] for r in read_audit(path).records] == ["after"]
                assert_whole_lines(path)
            finally:
                await writer.aclose()


async def test_full_disk_at_open_starts_unwritable_not_crashed(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        with small_tmpfs(tmp_path / "small") as small:
            path = small / "audit.jsonl"
            # A crash left a torn tail that fills its page, so not even a newline fits.
            path.write_bytes(b'{"uid":"torn' + b"x" * (4096 - 12))
            filler = fill(small, leave=0)
            writer = AuditWriter(path, probe_interval=0.05)
            writer.open()  # the newline cannot be written: not an error at start
            try:
                assert writer.writable is False
                with pytest.raises(OSError):
                    await writer.append(record("refused"))
                filler.unlink()
                await eventually(lambda: writer.writable, 10)
                await writer.append(record("after"))
                result = read_audit(path)
                assert [r["uid"] for r in result.records] == ["after"]
                assert result.skipped == 1  # the torn tail, terminated, never glued
            finally:
                await writer.aclose()


async def test_rename_logrotate_style_reopens_the_configured_path(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        path = tmp_path / "audit.jsonl"
        writer = AuditWriter(path, fsync=False)
        writer.open()
        try:
            await writer.append(record("before"))
            os.rename(path, rotated_path(path, 1))  # logrotate: mv, no signal
            await writer.append(record("after"))
            assert [r["uid"] for r in read_audit(path).records] == ["before", "after"]
            assert json.loads(path.read_bytes())["uid"] == "after"  # at the configured path
            assert writer.reopens == {"renamed": 1}
        finally:
            await writer.aclose()


async def test_deleted_file_is_recreated(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        path = tmp_path / "logs" / "audit.jsonl"
        writer = AuditWriter(path, fsync=False)
        writer.open()
        try:
            await writer.append(record("gone"))
            path.unlink()
            await writer.append(record("kept"))
            assert [r["uid"] for r in read_audit(path).records] == ["kept"]
            assert writer.reopens == {"deleted": 1}
            # Even the directory.
            path.unlink()
            path.parent.rmdir()
            await writer.append(record("kept-too"))
            assert [r["uid"] for r in read_audit(path).records] == ["kept-too"]
        finally:
            await writer.aclose()


async def test_reopen_request_lets_go_of_the_old_file_at_once(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        path = tmp_path / "audit.jsonl"
        writer = AuditWriter(path, fsync=False)
        writer.open()
        try:
            await writer.append(record("one"))
            moved = tmp_path / "audit.jsonl.old"
            os.rename(path, moved)
            writer.reopen()  # SIGHUP
            await eventually(lambda: path.exists(), 5)  # reopened without waiting for a line
            assert writer.reopens == {"signal": 1}
            await writer.append(record("two"))
            assert [json.loads(x)["uid"] for x in moved.read_bytes().splitlines()] == ["one"]
            assert [json.loads(x)["uid"] for x in path.read_bytes().splitlines()] == ["two"]
        finally:
            await writer.aclose()


async def test_replaced_file_is_followed(tmp_path: Path) -> None:
    # logrotate's "create": mv, then a new empty file at the path, before anyone signals.
    async with asyncio.timeout(BUDGET):
        path = tmp_path / "audit.jsonl"
        writer = AuditWriter(path, fsync=False)
        writer.open()
        try:
            await writer.append(record("one"))
            os.rename(path, rotated_path(path, 1))
            path.write_bytes(b"")
            await writer.append(record("two"))
            assert [json.loads(x)["uid"] for x in path.read_bytes().splitlines()] == ["two"]
        finally:
            await writer.aclose()


async def test_a_reopen_that_fails_recovers_by_itself(tmp_path: Path) -> None:
    # SIGHUP after a rotation onto a full disk, with a torn tail at the new path that no
    # newline can end: the writer is unready, and must become ready again once space comes
    # back, with no refusal to write (an unready replica gets none).
    async with asyncio.timeout(BUDGET):
        with small_tmpfs(tmp_path / "small") as small:
            path = small / "audit.jsonl"
            writer = AuditWriter(path, probe_interval=0.05)
            writer.open()
            try:
                await writer.append(record("one"))
                os.rename(path, rotated_path(path, 1))
                path.write_bytes(b'{"uid":"torn' + b"x" * (4096 - 12))
                filler = fill(small, leave=0)
                writer.reopen()
                await eventually(lambda: not writer.writable, 10)
                filler.unlink()
                await eventually(lambda: writer.writable, 10, lambda: str(writer.last_error))
                await writer.append(record("two"))
                result = read_audit(path)
                assert [r["uid"] for r in result.records] == ["one", "two"]
                assert result.skipped == 1  # the torn tail, ended, never glued
                assert path.read_bytes().endswith(b"x\n" + encode_line(record("two")))
            finally:
                await writer.aclose()
