"""The processes' logs (holdwarden/cli/logs.py): JSON lines on stderr, written by a thread
of their own, so that a stderr nobody reads (a container runtime that falls behind) never
blocks the code that logs, the enforcer's event loop included."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from holdwarden.cli import logs

# More than a pipe holds (64 KiB): a synchronous handler would block on the first few
# hundred lines.
RECORDS = 2 * logs.QUEUE_RECORDS
PADDING = "x" * 200


class Pipe:
    """A pipe whose write end is closed once: by the test (the reader then sees its end)
    or by the fixture. A second ``os.close`` of a number could close another file that
    reused it in between."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._write_open = True

    def close_write(self) -> None:
        if self._write_open:
            self._write_open = False
            os.close(self.write_fd)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    opened = Pipe()
    try:
        yield opened
    finally:
        # Unblock a writer stuck on the full pipe before closing it (a write to a closed
        # descriptor would print a traceback from its thread).
        reader = drain_in_thread(opened.read_fd, bytearray())
        logs.flush_logs(30)
        logs.stop_logging()
        logging.getLogger().handlers.clear()
        opened.close_write()
        reader.join(10)
        os.close(opened.read_fd)


def drain_in_thread(read_fd: int, into: bytearray) -> threading.Thread:
    def drain() -> None:
        while chunk := os.read(read_fd, 65536):
            into.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return reader


def test_records_are_json_lines_in_order(pipe: Pipe) -> None:
    read_fd, write_fd = pipe.read_fd, pipe.write_fd
    stream = os.fdopen(write_fd, "w", closefd=False)
    logs.configure_logging(logging.INFO, stream)
    log = logging.getLogger("holdwarden.test")
    for i in range(50):
        log.info("record", extra={"fields": {"n": i}})
    log.debug("below the level")
    assert logs.flush_logs(10)
    stream.flush()
    logs.stop_logging()
    pipe.close_write()
    data = bytearray()
    drain_in_thread(read_fd, data).join(10)
    entries = [json.loads(line) for line in bytes(data).splitlines()]
    assert [e["n"] for e in entries] == list(range(50))
    assert {e["logger"] for e in entries} == {"holdwarden.test"}
    assert all(e["level"] == "info" and e["msg"] == "record" for e in entries)


def test_a_stderr_nobody_reads_never_blocks_the_caller(pipe: Pipe) -> None:
    read_fd, write_fd = pipe.read_fd, pipe.write_fd
    stream = os.fdopen(write_fd, "w", closefd=False)
    logs.configure_logging(logging.INFO, stream)
    log = logging.getLogger("holdwarden.test")
    started = time.monotonic()
    for i in range(RECORDS):
        log.info("record", extra={"fields": {"n": i, "padding": PADDING}})
    took = time.monotonic() - started
    # The pipe is full and nobody reads it, yet every call came back. (A StreamHandler
    # would still be blocked in the first few hundred calls.) Generous bound for a busy
    # machine: the calls only format and queue.
    assert took < 60, took
    # Now the runtime catches up: every queued record arrives whole, then a warning that
    # counts the dropped ones, then what is logged afterwards.
    data = bytearray()
    reader = drain_in_thread(read_fd, data)
    assert logs.flush_logs(30)
    log.warning("after", extra={"fields": {"n": -1}})
    assert logs.flush_logs(30)
    stream.flush()
    logs.stop_logging()
    pipe.close_write()  # the reader reads to the end
    reader.join(10)
    entries = [json.loads(line) for line in bytes(data).splitlines()]
    numbered = [e["n"] for e in entries if "n" in e and e["n"] >= 0]
    assert numbered == sorted(numbered) and numbered[0] == 0
    (notice,) = [e for e in entries if e["logger"] == "holdwarden.logs"]
    assert notice["level"] == "warning"
    assert notice["dropped"] == RECORDS - len(numbered) > 0
    # The notice is written just before the first record written after the drops.
    assert 0 < entries.index(notice) < len(entries) - 1
    assert entries[-1]["msg"] == "after"


def test_flush_is_bounded_while_stderr_is_blocked(pipe: Pipe) -> None:
    write_fd = pipe.write_fd
    stream = os.fdopen(write_fd, "w", closefd=False)
    logs.configure_logging(logging.INFO, stream)
    log = logging.getLogger("holdwarden.test")
    for i in range(2_000):
        log.info("record", extra={"fields": {"n": i, "padding": PADDING}})
    started = time.monotonic()
    assert logs.flush_logs(0.5) is False
    assert time.monotonic() - started < 10
