"""Shared pieces of the audit tests: a small tmpfs (a disk that fills up), records, waits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SMALL_FS_BYTES = 64 * 1024


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int = SMALL_FS_BYTES) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``where`` (created), unmounted afterwards.

    Needs root (mount). Without it the test is skipped, with the reason.
    """
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        # Lazy, so a file still open somewhere cannot make the teardown fail or hang.
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def fill(directory: Path, leave: int) -> Path:
    """Fill the file system of ``directory`` with one file until about ``leave`` bytes
    are free (page-granular), and return that file (unlink it to free the space)."""
    filler = directory / "filler"
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    with open(filler, "ab") as handle:
        handle.write(b"\0" * max(0, free - leave))
    return filler


def record(uid: str, **fields: Any) -> dict[str, Any]:
    """A plausible audit record (what ``audit_record`` makes, minus the digests)."""
    base: dict[str, Any] = {
        "time": "2026-12-02T12:00:00.000000Z",
        "uid": uid,
        "dryRun": False,
        "rule": "held-trainjob-suspended",
        "message": "m" * 200,
        "user": "alice",
        "groups": ["system:authenticated"],
        "operation": "UPDATE",
        "resource": "trainjobs",
        "namespace": "ns",
        "name": "job",
        "instance": "3",
    }
    base.update(fields)
    return base


async def eventually(
    predicate: Callable[[], bool], timeout: float, why: Callable[[], str] = lambda: ""
) -> None:
    """Wait (bounded by ``timeout`` seconds) until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s {why()}")
        await asyncio.sleep(0.02)


async def eventually_async(
    predicate: Callable[[], Awaitable[bool]],
    timeout: float,
    why: Callable[[], str] = lambda: "",
    interval: float = 0.05,
) -> None:
    """``eventually`` for a predicate that must be awaited (a metric or /readyz read):
    wait (bounded by ``timeout`` seconds) until ``await predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s {why()}")
        await asyncio.sleep(interval)


def assert_whole_lines(path: Path) -> list[bytes]:
    """Every line of ``path`` is a whole JSON record or blank; the file ends in a newline."""
    import json

    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"{path} ends in a fragment: {data[-80:]!r}"
    lines = data.split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        if line.strip():
            assert isinstance(json.loads(line), dict), f"{path}:{number} {line[:80]!r}"
    return lines
