"""Structured logs for both processes (``holdwarden serve`` and ``holdwarden gate``): one
JSON object a line on stderr."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from typing import Any


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


def configure_logging(level: int = logging.INFO) -> None:
    """Send every log record to stderr as a JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


LOG_LEVELS = ("debug", "info", "warning")


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, as every long-running command (``serve``, ``gate``) takes it."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="log level of the JSON log on stderr (default info)",
    )
