"""Structured logs for both processes (``holdwarden serve`` and ``holdwarden gate``): one
JSON object a line on stderr, written by a thread of its own.

Invariant: logging never blocks the caller. In a Pod, stderr is a pipe the container
runtime reads; a runtime that falls behind (a busy node) fills the pipe, and a plain
``StreamHandler`` would then stop the event loop, and with it every review, in the middle
of a ``log.info``. So a record is formatted by the caller and queued (``QUEUE_RECORDS`` at
most); one writer thread writes the queue to stderr. A record that finds the queue full is
dropped and counted, and the next record written is preceded by a warning that says how
many were dropped. ``flush_logs`` (called at exit) waits a bounded time for the queue.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import logging.handlers
import queue
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from typing import Any, TextIO

# Records queued behind a stderr nobody reads before new ones are dropped: about 10 MB of
# the longest lines, minutes of a busy enforcer's refusals.
QUEUE_RECORDS = 10_000
# At exit, the writer gets this long to write what is queued; a blocked stderr is not
# waited for (the process is ending and its grace period is for draining requests).
FLUSH_SECONDS = 2.0


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. ``2026-12-02T12:00:00.123456Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, msg, and the record's
    ``fields`` extra (a dict) merged in."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["error"] = "".join(traceback.format_exception(*record.exc_info)).strip()
        return json.dumps(entry, default=str, separators=(",", ":"))


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A ``QueueHandler`` on a bounded queue: a record that does not fit is dropped and
    counted (``dropped``), never waited for."""

    def __init__(self, records: queue.Queue[Any]) -> None:
        super().__init__(records)
        self.dropped = 0
        self._lock = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def take_dropped(self) -> int:
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        return dropped


class _ReportingStreamHandler(logging.StreamHandler[TextIO]):
    """The writer thread's handler: before a record, the count of records dropped since the
    last one written, as a warning line of its own."""

    def __init__(self, stream: TextIO, source: DroppingQueueHandler) -> None:
        super().__init__(stream)
        self.source = source

    def emit(self, record: logging.LogRecord) -> None:
        dropped = self.source.take_dropped()
        if dropped:
            notice = logging.LogRecord(
                "holdwarden.logs", logging.WARNING, __file__, 0,
                "log records dropped: stderr was not being read", None, None,
            )  # fmt: skip
            notice.fields = {"dropped": dropped}
            try:
                self.stream.write(JsonFormatter().format(notice) + self.terminator)
            except Exception:
                self.handleError(notice)
        super().emit(record)


_listener: logging.handlers.QueueListener | None = None
_records: queue.Queue[Any] | None = None


def configure_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) as a JSON line, from a writer thread
    (the module's invariant). Calling it again replaces the previous set-up."""
    global _listener, _records
    stop_logging()
    records: queue.Queue[Any] = queue.Queue(QUEUE_RECORDS)
    front = DroppingQueueHandler(records)
    # The caller formats (QueueHandler.prepare): the record is final when it is queued.
    front.setFormatter(JsonFormatter())
    writer = _ReportingStreamHandler(stream if stream is not None else sys.stderr, front)
    # prepare() left the formatted line in msg: write it as it is.
    writer.setFormatter(logging.Formatter("%(message)s"))
    listener = logging.handlers.QueueListener(records, writer)
    listener.start()
    _listener, _records = listener, records
    root = logging.getLogger()
    root.handlers[:] = [front]
    root.setLevel(level)


def flush_logs(timeout: float = FLUSH_SECONDS) -> bool:
    """Wait at most ``timeout`` seconds until the queued records are written; True if they
    were."""
    records = _records
    if records is None:
        return True
    deadline = time.monotonic() + timeout
    while records.unfinished_tasks:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def stop_logging() -> None:
    """Flush (bounded) and stop the writer thread; records logged later are dropped."""
    global _listener, _records
    listener = _listener
    if listener is None:
        return
    written = flush_logs()
    _listener, _records = None, None
    if written:
        listener.stop()
    # Otherwise the writer is stuck on a blocked stderr: it is a daemon thread, and is
    # left to the process's exit rather than waited for.


atexit.register(stop_logging)


LOG_LEVELS = ("debug", "info", "warning")


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, as every long-running command (``serve``, ``gate``) takes it."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="log level of the JSON log on stderr (default info)",
    )
