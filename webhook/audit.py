"""The audit trail: one JSON line per refusal, durable before the refusal is answered.

Writing (``AuditWriter``):
  - The file is opened with ``O_APPEND``; one writer thread writes it, one batch at a time,
    so writes never interleave and the event loop never blocks on the disk.
  - Group commit: every line queued while the previous batch was being synced goes out in
    the next batch: one ``os.write`` (whole lines only), then ``fdatasync``, and only then
    is each caller's future resolved. The handler awaits that future before it answers, so every
    refusal a client was told about is on disk, even after ``kill -9`` or power loss.
  - A crash can leave at most the batch being written torn; none of its callers has been
    answered. On open, a file that does not end in a newline gets one, so the torn
    fragment stays its own (skipped) line and cannot corrupt the next record.

Reading (``read_audit``): filters records and skips lines that do not parse (a torn last
line after a crash), counting them instead of failing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

AUDIT_FIELDS = (
    "time",
    "uid",
    "dryRun",
    "rule",
    "message",
    "user",
    "groups",
    "operation",
    "resource",
    "namespace",
    "name",
    "instance",
)


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. ``2026-12-02T12:00:00.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One record as one line: compact JSON, no raw newline inside, a trailing newline."""
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


class AuditWriter:
    """Appends audit lines durably, in batches, from one writer thread (group commit).

    ``append`` is awaited by the handler; it returns only after the line is written and
    ``fdatasync`` has returned, and raises ``OSError`` if either failed. Lines wait on the
    event loop while a batch is being synced and go out together in the next one, so the
    thread hand-off and the sync are paid once per batch, not once per line. One writer
    serves one event loop.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._fd = -1
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.batches = 0
        self.lines = 0

    def open(self) -> None:
        """Open the file (creating directories and the file) and start the writer thread."""
        if self._fd >= 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        self._terminate_torn_line()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")

    def _terminate_torn_line(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as existing:
            existing.seek(size - 1)
            last = existing.read(1)
        if last != b"\n":
            os.write(self._fd, b"\n")
            self._sync()

    def _sync(self) -> None:
        if self._fsync:
            os.fdatasync(self._fd)

    async def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` and return once it is durably on disk."""
        if self._fd < 0 or self._executor is None:
            raise OSError("audit writer is not open")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.append((encode_line(record), done))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending and self._executor is not None:
                batch, self._pending = self._pending, []
                data = b"".join(line for line, _ in batch)
                error: OSError | None = None
                try:
                    await loop.run_in_executor(self._executor, self._commit, data)
                except OSError as exc:
                    error = exc
                self.batches += 1
                self.lines += len(batch)
                for _, done in batch:
                    if done.done():
                        continue  # the waiting handler was cancelled
                    if error is None:
                        done.set_result(None)
                    else:
                        done.set_exception(error)
        finally:
            self._flusher = None
            if self._executor is None:  # closed under us: nothing queued will be written
                stranded, self._pending = self._pending, []
                for _, done in stranded:
                    if not done.done():
                        done.set_exception(OSError("audit writer closed"))

    def _commit(self, data: bytes) -> None:
        """Writer thread: one write of whole lines, then the sync."""
        view = memoryview(data)
        while view:
            # One call writes the whole batch in practice; loop only on a short write.
            written = os.write(self._fd, view)
            view = view[written:]
        self._sync()

    async def aclose(self) -> None:
        """Wait for every queued line to be durable, then close."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        self.close()

    def close(self) -> None:
        """Stop the writer thread (after the batch in progress) and close the file."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class AuditRead:
    """The records that matched, and how many lines were skipped as unreadable."""

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)


def parse_time(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        yield from enumerate(handle, start=1)


def read_audit(
    path: str | Path,
    *,
    namespace: str | None = None,
    name: str | None = None,
    user: str | None = None,
    rule: str | None = None,
    since: datetime | None = None,
) -> AuditRead:
    """Records of the audit log at ``path`` that match every filter given.

    A line that is not a JSON object (a torn last line after a crash, or damage) is skipped
    and counted in ``skipped``; reading never fails on content. A missing file reads empty.
    """
    result = AuditRead()
    if not Path(path).exists():
        return result
    for number, raw in iter_lines(path):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            result.skipped += 1
            result.skipped_lines.append(number)
            continue
        if namespace is not None and record.get("namespace") != namespace:
            continue
        if name is not None and record.get("name") != name:
            continue
        if user is not None and record.get("user") != user:
            continue
        if rule is not None and record.get("rule") != rule:
            continue
        if since is not None:
            moment = parse_time(str(record.get("time", "")))
            if moment is None or moment < since:
                continue
        result.records.append(record)
    return result
