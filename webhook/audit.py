"""The audit trail: one bounded JSON line per refusal, durable before the refusal is answered.

What a line holds (``audit_record``):
  - identifying fields only (time, uid, dryRun, rule, message, user, groups, operation,
    apiGroup, resource, kind, namespace, name, instance, the effective suspend/active
    values), the size of the request body and SHA-256 digests of the old and new objects
    as the body carried them, never the objects themselves;
  - every free-text field is capped (``FIELD_LIMITS``, in encoded bytes) and a cut field
    is named in ``truncated`` with its original length, so an encoded line is at most
    ``MAX_LINE_BYTES`` whatever the request held. The who/what fields come from the review
    body, which the apiserver signs nothing of: see docs/explanation/audit-trail.md for which
    fields a
    caller can forge and for the apiserver's own audit log as the authoritative record.

Writing (``AuditWriter``):
  - The file is opened with ``O_APPEND``; one writer thread writes it, one batch at a time,
    so writes never interleave and the event loop never blocks on the disk.
  - Group commit: every line queued while the previous batch was being synced goes out in
    the next batch: one ``os.write`` (whole lines only), then ``fdatasync``, and only then
    is each caller's future resolved. The handler awaits that future before it answers, so
    every refusal a client was told about is on disk, even after ``kill -9`` or power loss.
  - A line is whole or absent: a write or sync that fails is cut back (``ftruncate``) to
    the size the file had before it, so a torn fragment is never glued to the next line;
    if even that fails, the next write starts with a newline. A failed batch fails its
    callers (``OSError``) and marks the writer not ``writable`` (``/readyz`` fails) until a
    write succeeds again; while it is not, a probe retries every ``probe_interval`` seconds
    without adding a record (a blank line it cuts back off).
  - A crash can leave at most the batch being written torn; none of its callers has been
    answered. On open, a file that does not end in a newline gets one, so the torn
    fragment stays its own (skipped) line and cannot corrupt the next record.
  - Disk budget: before a batch would take the file past ``max_bytes`` the file is rotated
    (``audit.jsonl`` -> ``audit.jsonl.1`` -> ... -> ``audit.jsonl.<max_files>``, the oldest
    dropped), so the log never takes more than ``max_bytes * (max_files + 1)`` bytes.
  - The path is checked before every batch: if the file was renamed (logrotate's ``mv``)
    or deleted, or ``reopen()`` was asked for (SIGHUP), the writer reopens the path,
    creating it again, so no refusal goes to a file nobody reads.

Reading (``read_audit``): the rotated files oldest first, then the current one; filters
records and skips lines that do not parse (a torn last line after a crash), counting them
instead of failing. Lines written before the bounded format (whole messages, no digests)
read the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from holdwarden import objects

if TYPE_CHECKING:
    from holdwarden.webhook.review import Review
    from holdwarden.webhook.rules import Violation

log = logging.getLogger("holdwarden.webhook.audit")

AUDIT_FIELDS = (
    "time",
    "uid",
    "dryRun",
    "rule",
    "message",
    "user",
    "groups",
    "operation",
    "apiGroup",
    "resource",
    "kind",
    "namespace",
    "name",
    "instance",
    "requestBytes",
    "oldObjectSha256",
    "objectSha256",
    "truncated",
)

# Caps in bytes of the JSON-encoded string (ensure_ascii: up to 12 bytes per character).
# Kubernetes' own limits are well inside them (names 253, uids 36, usernames in practice
# < 200), so a cut means the review was not a real apiserver's.
FIELD_LIMITS: Mapping[str, int] = {
    "uid": 128,
    "message": 1024,
    "user": 256,
    "operation": 16,
    "apiGroup": 256,
    "resource": 64,
    "kind": 64,
    "namespace": 256,
    "name": 256,
    "instance": 64,
}
GROUP_LIMIT = 256  # bytes per group name
MAX_GROUPS = 16  # groups kept; the rest are counted in ``truncated``
# Worst case with every field at its cap is about 6.5 KiB; the writer enforces this bound.
MAX_LINE_BYTES = 8192

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_MAX_FILES = 5
PROBE_INTERVAL = 1.0

_ROTATED = re.compile(r"\.(\d+)\Z")


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. ``2026-12-02T12:00:00.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One record as one line: compact JSON, no raw newline inside, a trailing newline."""
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=True) + "\n").encode()


# --- the bounded record -----------------------------------------------------------------


def _encoded_size(text: str) -> int:
    # The C encoder json.dumps uses for a str with ensure_ascii; called directly, it costs
    # a fraction of json.dumps (this runs for every field of every refusal).
    return len(encode_basestring_ascii(text)) - 2


def cap_text(value: str, limit: int) -> tuple[str, bool]:
    """``value`` cut so that its JSON encoding (ensure_ascii) is at most ``limit`` bytes;
    the flag says whether anything was cut. Cuts fall on character boundaries."""
    if len(value) <= limit and _encoded_size(value) <= limit:
        return value, False
    head = value[: limit + 1]  # every character encodes to at least one byte
    used, end = 0, 0
    for end, char in enumerate(head):  # noqa: B007  # ``end`` is read after the loop
        used += _encoded_size(char)
        if used > limit:
            break
    else:
        end = len(head)
    return value[:end], True


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _RawRequest(msgspec.Struct):
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    oldObject: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # Kubernetes' name


class _RawReview(msgspec.Struct):
    request: _RawRequest | None = None


_RAW_DECODER = msgspec.json.Decoder(_RawReview)


# A JSON string (escapes included), or a bracket: the tokens raw_objects steps through.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_COLON = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*")
_BARE = re.compile(rb"[^,\]}\s]+")  # a number, true, false or null
_RAW_FIELDS = ("oldObject", "object")


def raw_objects(body: bytes) -> tuple[bytes, bytes]:
    """The raw ``request.oldObject`` and ``request.object`` (b"" when absent), as
    ``_RAW_DECODER`` gives them, for a body nested too deep for msgspec.

    Invariant: for valid JSON (``parse_review`` has read the body) the same bytes as
    ``_RAW_DECODER`` (the last of duplicate keys wins, escaped keys count as their text).
    Iterative: one pass over strings and brackets, so no depth recurses.
    """
    raws = dict.fromkeys(_RAW_FIELDS, b"")
    depth = 0
    opens_request = False  # the next bracket opens the top-level "request" object
    in_request = False  # depth 2 is inside that object
    capture = ""  # the field whose container is open, or ""
    capture_at = 0
    for token in _TOKEN.finditer(body):
        at = token.start()
        first = body[at]
        if first == 0x22:  # a string: a key only if a colon follows
            if depth != 1 and not (depth == 2 and in_request):
                continue
            colon = _COLON.match(body, token.end())
            if colon is None:
                continue
            key = json.loads(token.group())
            value_at = colon.end()
            opening = body[value_at : value_at + 1]
            if depth == 1:
                if key == "request":
                    raws = dict.fromkeys(_RAW_FIELDS, b"")
                    opens_request = opening == b"{"
            elif key in raws:
                if opening in (b"{", b"["):
                    capture, capture_at = key, value_at
                else:
                    value = (_STRING if opening == b'"' else _BARE).match(body, value_at)
                    raws[key] = value.group() if value else b""
        elif first in (0x7B, 0x5B):  # { [
            depth += 1
            if depth == 2 and opens_request:
                in_request, opens_request = True, False
        else:
            depth -= 1
            if depth == 2 and capture:
                raws[capture] = body[capture_at : token.end()]
                capture = ""
            elif depth == 1:
                in_request = False
    return raws["oldObject"], raws["object"]


def object_digests(body: bytes) -> tuple[str | None, str | None]:
    """SHA-256 of the old and the new object exactly as the review body carries them
    (None when absent or null, or when the body cannot be re-read)."""

    def digest(data: bytes) -> str | None:
        return None if data in (b"", b"null") else _sha256(data)

    try:
        request = _RAW_DECODER.decode(body).request
    except RecursionError:
        # Skipping into msgspec.Raw recurses as deep as the body (webhook/review.py).
        try:
            old, new = raw_objects(body)
        except ValueError:  # a key that is not a JSON string: the body is not JSON
            return None, None
        return digest(old), digest(new)
    except msgspec.DecodeError:
        return None, None
    if request is None:
        return None, None
    return digest(bytes(request.oldObject)), digest(bytes(request.object))


def audit_record(
    review: Review, violation: Violation, now: datetime, body: bytes | None = None
) -> dict[str, Any]:
    """The bounded audit line for one refusal (see the module docstring).

    ``body`` is the request as received; without it the digests are null.
    """
    change = review.change
    truncated: dict[str, int] = {}

    def text(name: str, value: str | None) -> str | None:
        if value is None:
            return None
        kept, cut = cap_text(value, FIELD_LIMITS[name])
        if cut:
            truncated[name] = len(value)
        return kept

    groups: list[str] = []
    for group in change.groups[:MAX_GROUPS]:
        kept, cut = cap_text(group, GROUP_LIMIT)
        groups.append(kept)
        if cut:
            truncated["groups"] = len(change.groups)
    if len(change.groups) > MAX_GROUPS:
        truncated["groups"] = len(change.groups)
    old_digest, new_digest = object_digests(body) if body is not None else (None, None)
    record: dict[str, Any] = {
        "time": rfc3339(now),
        "uid": text("uid", review.uid),
        "dryRun": review.dry_run,
        "rule": str(violation.rule),
        "message": text("message", violation.message),
        "user": text("user", change.username),
        "groups": groups,
        "operation": text("operation", change.operation),
        "apiGroup": text("apiGroup", change.group),
        "resource": text("resource", change.resource),
        "kind": text("kind", change.kind),
        "namespace": text("namespace", change.namespace),
        "name": text("name", change.name),
        "instance": text("instance", violation.instance),
        "requestBytes": len(body) if body is not None else None,
        "oldObjectSha256": old_digest,
        "objectSha256": new_digest,
    }
    if change.is_trainjob:
        record["oldSuspend"] = None if change.old is None else objects.suspended(change.old)
        record["newSuspend"] = objects.suspended(change.new)
    elif change.is_workload:
        record["oldActive"] = None if change.old is None else objects.active(change.old)
        record["newActive"] = objects.active(change.new)
    if truncated:
        record["truncated"] = truncated
    return record


def bounded_line(record: Mapping[str, Any]) -> bytes:
    """``encode_line(record)``, or, if that exceeds ``MAX_LINE_BYTES`` (a record not made by
    ``audit_record``), a stand-in line that keeps the time, uid and rule and says so."""
    line = encode_line(record)
    if len(line) <= MAX_LINE_BYTES:
        return line
    stand_in = {
        "time": str(record.get("time", ""))[:64],
        "uid": cap_text(str(record.get("uid", "")), 128)[0],
        "rule": cap_text(str(record.get("rule", "")), 64)[0],
        "truncated": {"line": len(line)},
    }
    return encode_line(stand_in)


# --- the writer -------------------------------------------------------------------------


def rotated_path(path: Path, number: int) -> Path:
    """``audit.jsonl`` -> ``audit.jsonl.<number>`` (logrotate's numbering: 1 is the newest)."""
    return path.with_name(f"{path.name}.{number}")


def _fsync_dir(directory: Path) -> None:
    # A created or renamed file is only findable after a crash once its directory is synced.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AuditWriter:
    """Appends audit lines durably, in batches, from one writer thread (group commit).

    ``append`` is awaited by the handler; it returns only after the line is written and
    ``fdatasync`` has returned, and raises ``OSError`` if either failed (the line is then
    absent from the file). Lines wait on the event loop while a batch is being synced and
    go out together in the next one, so the thread hand-off and the sync are paid once per
    batch, not once per line. One writer serves one event loop.

    Invariants: the file only ever holds whole lines plus, after a crash, one torn tail
    that the next open terminates; no file exceeds ``max_bytes`` (a line is never split
    across files); at most ``max_files`` rotated files are kept. ``writable`` is False
    from a failed write until the next successful write or probe. Every file operation
    runs on the one writer thread, so they never race one another.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fsync: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        if max_bytes < MAX_LINE_BYTES:
            raise ValueError(f"max_bytes must be at least {MAX_LINE_BYTES} (one line)")
        if max_files < 1:
            raise ValueError("max_files must be at least 1")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.probe_interval = probe_interval
        self._fsync = fsync
        self._fd = -1
        self._identity: tuple[int, int] = (0, 0)
        # True when the file may end in a fragment (a failed write that could not be cut
        # back): the next write then starts with a newline.
        self._torn = False
        self._reopen_asked = False
        self._pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.batches = 0
        self.lines = 0
        self.writable = True
        self.last_error: str | None = None
        self.failed_writes = 0
        self.rotations = 0
        self.reopens: dict[str, int] = {}

    # -- life cycle (event loop thread) ---------------------------------------------------

    def open(self) -> None:
        """Open the file (creating directories and the file) and start the writer thread.

        Raises ``OSError`` if the file cannot be opened; a full disk is not an error here:
        the writer starts not ``writable`` and the first write or probe repairs the tail.
        """
        if self._fd >= 0:
            return
        self._open_file()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-writer")
        if not self.writable:
            # Unready replicas get no refusals to write, so only a probe can recover.
            with contextlib.suppress(RuntimeError):  # no running loop: the first append will
                self._start_probe()

    def reopen(self) -> None:
        """Reopen the file at its path (SIGHUP), on the writer thread, after any batch in
        progress; a batch that comes first reopens it itself.

        Call it on the event loop (a handler from ``loop.add_signal_handler`` is): it only
        sets a flag and hands the reopen to the writer thread.
        """
        self._reopen_asked = True
        if self._executor is None:
            return
        # Now, not at the next refusal, so the old file is let go at once.
        done = asyncio.get_running_loop().run_in_executor(self._executor, self._reopen_now)
        # A reopen can fail (e.g. the new file's torn tail cannot be ended on a full disk);
        # then only the probe can make the writer writable again.
        done.add_done_callback(lambda _: None if self.writable else self._start_probe())

    def _reopen_now(self) -> None:
        try:
            self._check_path()
        except OSError as exc:
            self._failed(exc)

    def _open_file(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        # Read-write so the last byte can be read back through the same descriptor.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        st = os.fstat(fd)
        self._fd, self._identity, self._torn = fd, (st.st_dev, st.st_ino), False
        if created and self._fsync:
            _fsync_dir(self.path.parent)
        try:
            self._terminate_torn_line()
        except OSError as exc:
            self._torn = True
            self._failed(exc)

    def _terminate_torn_line(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        if os.pread(self._fd, 1, size - 1) != b"\n":
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
        self._pending.append((bounded_line(record), done))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending and self._executor is not None:
                batch, self._pending = self._pending, []
                lines = [line for line, _ in batch]
                committed, error = await loop.run_in_executor(self._executor, self._commit, lines)
                self.batches += 1
                self.lines += len(batch)
                for index, (_, done) in enumerate(batch):
                    if done.done():
                        continue  # the waiting handler was cancelled
                    if index < committed:
                        done.set_result(None)
                    else:
                        assert error is not None
                        done.set_exception(error)
                if error is not None:
                    self._start_probe()
        finally:
            self._flusher = None
            if self._executor is None:  # closed under us: nothing queued will be written
                stranded, self._pending = self._pending, []
                for _, done in stranded:
                    if not done.done():
                        done.set_exception(OSError("audit writer closed"))

    def _start_probe(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_writable())

    async def _probe_until_writable(self) -> None:
        """While not writable, try a write that leaves no record, every ``probe_interval``:
        without it an unready replica would get no traffic, so never write, so never
        become ready again."""
        loop = asyncio.get_running_loop()
        while not self.writable and self._executor is not None:
            await asyncio.sleep(self.probe_interval)
            if self._executor is None or self.writable:
                return
            if self._flusher is None:  # a real batch in flight tests the disk just as well
                await loop.run_in_executor(self._executor, self._probe)

    # -- the writer thread ------------------------------------------------------------------

    def _commit(self, lines: list[bytes]) -> tuple[int, OSError | None]:
        """Writer thread: write ``lines`` as whole lines, rotating when the budget says so.

        Returns how many lines (a prefix) are durably written, and the error that stopped
        the rest (None if all are). One ``os.write`` + ``fdatasync`` per file touched.
        """
        committed = 0
        try:
            self._check_path()
            size = os.fstat(self._fd).st_size
            while committed < len(lines):
                if size > 0 and size + len(lines[committed]) > self.max_bytes:
                    self._rotate()
                    size = 0
                chunk: list[bytes] = []
                end = committed
                while end < len(lines) and (not chunk or size + len(lines[end]) <= self.max_bytes):
                    size += len(lines[end])
                    chunk.append(lines[end])
                    end += 1
                self._write_whole(b"".join(chunk))
                committed = end
        except OSError as exc:
            self._failed(exc)
            return committed, exc
        self.writable, self.last_error = True, None
        return committed, None

    def _failed(self, exc: OSError) -> None:
        self.failed_writes += 1
        if self.writable:
            log.error(
                "audit log is not writable; /readyz fails until a write succeeds",
                extra={"fields": {"auditLog": str(self.path), "error": str(exc)}},
            )
        self.writable, self.last_error = False, str(exc)

    def _write_whole(self, data: bytes) -> None:
        """Append ``data`` (whole lines) and sync, or leave the file as it was and raise."""
        if self._torn:
            self._repair()
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                # One call writes it all in practice; a short write means the disk is full
                # and the next call says so.
                written = os.write(self._fd, view)
                view = view[written:]
            self._sync()
        except OSError:
            self._cut_back(start)
            raise

    def _cut_back(self, size: int) -> None:
        # Whole or absent: drop what a failed write left past the last whole line.
        # Shrinking a file needs no free space, so this works on a full disk.
        try:
            os.ftruncate(self._fd, size)
            self._sync()
        except OSError as exc:
            self._torn = True
            log.error(
                "audit log: could not cut back a failed write; the next line starts fresh",
                extra={"fields": {"auditLog": str(self.path), "error": str(exc)}},
            )

    def _repair(self) -> None:
        """The file may end in a fragment: end it with a newline (it then reads as one
        skipped line) before anything else is appended."""
        self._terminate_torn_line()
        self._torn = False

    def _probe(self) -> None:
        """Writer thread: write and sync a blank line the size of the largest record, then
        cut it back off; success makes the writer ``writable`` again. A crash in between
        leaves a blank line, which readers skip."""
        try:
            self._check_path()
            if self._torn:
                self._repair()
            start = os.fstat(self._fd).st_size
            self._write_whole(b" " * (MAX_LINE_BYTES - 1) + b"\n")
            os.ftruncate(self._fd, start)
            self._sync()
        except OSError as exc:
            self.last_error = str(exc)
            return
        if not self.writable:
            log.info("audit log is writable again", extra={"fields": {"auditLog": str(self.path)}})
        self.writable, self.last_error = True, None

    def _check_path(self) -> None:
        """Reopen the path if asked to, or if the file we hold is no longer the one there
        (renamed or deleted): lines must go where readers look."""
        reason: str | None = None
        if self._reopen_asked:
            reason = "signal"
        else:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                reason = "deleted" if os.fstat(self._fd).st_nlink == 0 else "renamed"
            else:
                if (st.st_dev, st.st_ino) != self._identity:
                    reason = "deleted" if os.fstat(self._fd).st_nlink == 0 else "renamed"
        if reason is None:
            return
        self._reopen_asked = False
        old = self._fd
        self._open_file()
        os.close(old)  # every line written to it was synced before its caller was answered
        self.reopens[reason] = self.reopens.get(reason, 0) + 1
        log.warning(
            "audit log reopened",
            extra={"fields": {"auditLog": str(self.path), "reason": reason}},
        )

    def _rotate(self) -> None:
        """audit.jsonl.<n> -> .<n+1> (the last one is replaced, so dropped), the current
        file -> .1, then a new current file. Its lines are all synced already."""
        for number in range(self.max_files - 1, 0, -1):
            source = rotated_path(self.path, number)
            if source.exists():
                os.replace(source, rotated_path(self.path, number + 1))
        os.replace(self.path, rotated_path(self.path, 1))
        old = self._fd
        self._open_file()
        os.close(old)
        if self._fsync:
            _fsync_dir(self.path.parent)
        self.rotations += 1

    # -- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for every queued line to be durable, then close."""
        while self._flusher is not None:
            await asyncio.shield(self._flusher)
        self.close()

    def close(self) -> None:
        """Stop the writer thread (after the batch in progress) and close the file."""
        if self._prober is not None:
            self._prober.cancel()
            self._prober = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unready_reason(self) -> str | None:
        """Why ``/readyz`` must fail because of the audit log, or None if it need not."""
        if self.writable:
            return None
        return f"audit log {self.path} is not writable: {self.last_error}"


# --- reading ----------------------------------------------------------------------------


@dataclass
class AuditRead:
    """The records that matched, and how many lines were skipped as unreadable.

    ``skipped_lines`` holds line numbers within their file; ``skipped_at`` says which file.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    skipped_lines: list[int] = field(default_factory=list)
    skipped_at: list[tuple[Path, int]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    # Stream reads only: JSON lines that are not audit records (the server's own logs).
    other: int = 0


def parse_time(text: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def audit_files(path: str | Path) -> list[Path]:
    """The log's files, newest first: ``path`` itself, then ``path.1``, ``path.2``, ...
    (every numeric suffix present, whoever rotated it). Compressed or dated copies made
    by an external logrotate are not read."""
    path = Path(path)
    numbered: list[tuple[int, Path]] = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        siblings = []
    for sibling in siblings:
        if not sibling.name.startswith(path.name + "."):
            continue
        match = _ROTATED.search(sibling.name[len(path.name) :])
        if match is not None and match.start() == 0:
            numbered.append((int(match.group(1)), sibling))
    return [path, *(p for _, p in sorted(numbered))]


def _open_snapshot(path: str | Path) -> list[tuple[Path, Any]]:
    """Open every file of the log, newest first, and return them oldest first.

    Newest first, and each file once (by device and inode): a rotation that happens while
    the files are being opened can then only make a file show up under a second name, which
    is skipped, never make one be missed.
    """
    opened: list[tuple[Path, Any]] = []
    seen: set[tuple[int, int]] = set()
    for candidate in audit_files(path):
        try:
            handle = open(candidate, "rb")  # noqa: SIM115  # closed by the caller
        except FileNotFoundError:
            continue
        st = os.fstat(handle.fileno())
        if (st.st_dev, st.st_ino) in seen:
            handle.close()
            continue
        seen.add((st.st_dev, st.st_ino))
        opened.append((candidate, handle))
    opened.reverse()
    return opened


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        yield from enumerate(handle, start=1)


@dataclass(frozen=True)
class AuditFilter:
    """The filters of ``holdwarden audit``; a record passes when it matches every one set."""

    namespace: str | None = None
    name: str | None = None
    user: str | None = None
    rule: str | None = None
    since: datetime | None = None

    def matches(self, record: dict[str, Any]) -> bool:
        for key, wanted in (
            ("namespace", self.namespace),
            ("name", self.name),
            ("user", self.user),
            ("rule", self.rule),
        ):
            if wanted is not None and record.get(key) != wanted:
                return False
        if self.since is not None:
            moment = parse_time(str(record.get("time", "")))
            if moment is None or moment < self.since:
                return False
        return True


def is_audit_record(obj: Mapping[str, Any]) -> bool:
    """A JSON object read from a mixed stream (``kubectl logs``) is an audit record when it
    carries the stdout sink's ``"audit": true``, or, with no ``audit`` key at all, is a
    file line: it has a ``rule`` and is not one of the server's log lines (``logger``)."""
    marker = obj.get("audit")
    if "audit" in obj:
        return marker is True
    return "rule" in obj and "logger" not in obj


def _read_lines(
    result: AuditRead,
    source: Path,
    handle: Iterable[bytes],
    wanted: AuditFilter,
    *,
    mixed: bool = False,
) -> None:
    """Add the records of ``handle`` that pass ``wanted`` to ``result``; a line that is not
    a JSON object is counted as skipped (with ``source`` and its line number), never fatal.
    ``mixed``: the stream also holds other JSON lines (logs), counted in ``other``."""
    for number, raw in enumerate(handle, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            result.skipped += 1
            result.skipped_lines.append(number)
            result.skipped_at.append((source, number))
            continue
        if mixed and not is_audit_record(record):
            result.other += 1
            continue
        if mixed:
            record.pop("audit", None)
        if wanted.matches(record):
            result.records.append(record)


def read_audit(
    path: str | Path,
    *,
    namespace: str | None = None,
    name: str | None = None,
    user: str | None = None,
    rule: str | None = None,
    since: datetime | None = None,
) -> AuditRead:
    """Records of the audit log at ``path`` (its rotated files included, oldest first)
    that match every filter given.

    A line that is not a JSON object (a torn last line after a crash, or damage) is skipped
    and counted in ``skipped``; reading never fails on content. A missing file reads empty
    (``files`` is then empty: the CLI reports that as an error, not as "no refusals").
    """
    wanted = AuditFilter(namespace, name, user, rule, since)
    result = AuditRead()
    files = _open_snapshot(path)
    try:
        for source, handle in files:
            result.files.append(source)
            _read_lines(result, source, handle, wanted)
    finally:
        for _, handle in files:
            handle.close()
    return result


def read_audit_stream(
    stream: Iterable[bytes], wanted: AuditFilter, source: Path = Path("<stdin>")
) -> AuditRead:
    """Records of audit lines read from ``stream`` (``holdwarden audit -``: e.g. the
    concatenated files of several Pods, or ``kubectl logs`` output of the stdout sink),
    filtered like ``read_audit``. Lines that are not JSON objects are skipped; JSON lines
    that are not audit records (``is_audit_record``: the server's logs) are counted in
    ``other``; the stdout sink's ``audit`` marker is dropped from the records."""
    result = AuditRead()
    result.files.append(source)
    _read_lines(result, source, stream, wanted, mixed=True)
    return result
