"""Prometheus metrics of the enforcer, in a registry of its own (not the global one), so
that tests and several servers in one process never collide.

The values are plain Python numbers updated on the event loop thread, and turned into
metric families only when scraped (a custom collector). Invariant: every update and every
scrape happens on the one event loop that serves both ports, so no lock is needed; this
keeps the bookkeeping at about a microsecond per review, where prometheus_client's own
locked Counter/Histogram cost ~15 us.
"""

from __future__ import annotations

import bisect
import importlib.metadata
import math
import platform
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from holdwarden.vocabulary import RuleId

# Admission calls should take well under the apiserver's webhook timeout (10s default);
# buckets resolve the sub-millisecond range where a healthy enforcer lives.
try:
    _VERSION = importlib.metadata.version("holdwarden")
except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
    _VERSION = "unknown"
# The label values the reviews counter starts with (webhook/server.py's known values).
_RESOURCES = ("trainjobs", "workloads")
_OPERATIONS = ("CREATE", "UPDATE", "DELETE")

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST

BUILD_INFO = "holdwarden_build_info"
REVIEWS = "holdwarden_webhook_reviews"
DURATION = "holdwarden_webhook_review_duration_seconds"
IN_FLIGHT = "holdwarden_webhook_in_flight_requests"
AUDIT_ERRORS = "holdwarden_webhook_audit_write_errors"
CERT_EXPIRY = "holdwarden_webhook_certificate_expiry_timestamp_seconds"
AUDIT_WRITABLE = "holdwarden_webhook_audit_writable"
AUDIT_FAILED_WRITES = "holdwarden_webhook_audit_failed_writes"
AUDIT_REOPENS = "holdwarden_webhook_audit_reopens"
AUDIT_ROTATIONS = "holdwarden_webhook_audit_rotations"
CERT_RELOAD_REJECTED = "holdwarden_cert_reload_rejected"
CONNECTIONS = "holdwarden_webhook_connections"
CONNECTIONS_CLOSED = "holdwarden_webhook_connections_closed"


class AuditHealth(Protocol):
    """What the metrics read from ``holdwarden.webhook.audit.AuditWriter`` at scrape time."""

    writable: bool
    failed_writes: int
    rotations: int
    reopens: dict[str, int]


class Level:
    """A gauge that goes up and down."""

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


class Tally:
    """A counter without labels."""

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class Metrics(Collector):
    """The enforcer's metrics. ``reviews`` label ``decision`` is allowed | denied | skipped |
    invalid | error; ``rule`` is the refusing rule id, or empty."""

    def __init__(self) -> None:
        self.reviews: dict[tuple[str, str, str, str], int] = {}
        self.buckets = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.duration_sum = 0.0
        self.in_flight = Level()
        self.audit_errors = Tally()
        self._not_after: Callable[[], datetime | None] = lambda: None
        self._cert_rejections: Callable[[], Mapping[str, int]] = dict
        self._audit: AuditHealth | None = None
        self._connections: Callable[[], tuple[int, Mapping[str, int]]] | None = None
        # Every series a dashboard or an alert reads exists from the start, at 0: rate() of
        # a series that appears only with its first review sees no increase at first.
        for resource in _RESOURCES:
            for operation in _OPERATIONS:
                for decision in ("allowed", "skipped", "error"):
                    self.reviews[(resource, operation, decision, "")] = 0
                for rule in RuleId:
                    self.reviews[(resource, operation, "denied", str(rule))] = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        # The process's CPU, memory and open files, the Python version and its GC: the
        # standard collectors, in this registry (the default one is not served).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def track_certificate(self, not_after: Callable[[], datetime | None]) -> None:
        """Read the certificate's notAfter at every scrape (it changes on hot reload)."""
        self._not_after = not_after

    def track_certificate_rejections(self, rejected: Callable[[], Mapping[str, int]]) -> None:
        """Read, at every scrape, how many pairs hot reload refused to install, by reason."""
        self._cert_rejections = rejected

    def track_connections(self, read: Callable[[], tuple[int, Mapping[str, int]]]) -> None:
        """Read, at every scrape, the TLS connections open and those the server closed,
        by reason (webhook/connections.py)."""
        self._connections = read

    def track_audit(self, audit: AuditHealth) -> None:
        """Read the audit writer's health and counters at every scrape. Its counters are
        ints bumped by its one writer thread; reading an int needs no lock."""
        self._audit = audit

    def observe(
        self, resource: str, operation: str, decision: str, rule: str, seconds: float
    ) -> None:
        key = (resource, operation, decision, rule)
        self.reviews[key] = self.reviews.get(key, 0) + 1
        self.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.duration_sum += seconds

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            BUILD_INFO,
            "Always 1; the labels say which holdwarden is running.",
            labels=("version", "python"),
        )
        build.add_metric([_VERSION, platform.python_version()], 1)
        yield build
        reviews = CounterMetricFamily(
            REVIEWS,
            "Admission reviews answered, by resource, operation, decision and rule.",
            labels=("resource", "operation", "decision", "rule"),
        )
        for key, count in sorted(self.reviews.items()):
            reviews.add_metric(list(key), count)
        yield reviews

        cumulative, running = [], 0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), self.buckets, strict=True):
            running += count
            cumulative.append((bound, running))
        yield HistogramMetricFamily(
            DURATION,
            "Time from request received to response ready (includes the audit fsync).",
            buckets=cumulative,
            sum_value=self.duration_sum,
        )
        yield GaugeMetricFamily(
            IN_FLIGHT, "Admission requests being handled now.", value=self.in_flight.value
        )
        yield CounterMetricFamily(
            AUDIT_ERRORS,
            "Refusals whose audit line could not be written (the refusal was still sent).",
            value=self.audit_errors.value,
        )
        moment = self._not_after()
        yield GaugeMetricFamily(
            CERT_EXPIRY,
            "notAfter of the serving certificate in use, as a Unix timestamp.",
            value=moment.timestamp() if moment is not None else math.nan,
        )
        rejected = CounterMetricFamily(
            CERT_RELOAD_REJECTED,
            "Certificate/key pairs hot reload refused to install, by reason.",
            labels=("reason",),
        )
        for reason, count in sorted(dict(self._cert_rejections()).items()):
            rejected.add_metric([reason], count)
        yield rejected
        if self._connections is not None:
            open_now, closed = self._connections()
            yield GaugeMetricFamily(
                CONNECTIONS, "TLS connections open on the admission port.", value=open_now
            )
            by_reason = CounterMetricFamily(
                CONNECTIONS_CLOSED,
                "Connections the server closed or refused, by reason (evicted at the cap, "
                "refused at the cap, idle timeout, header timeout, drain).",
                labels=("reason",),
            )
            for reason, count in sorted(dict(closed).items()):
                by_reason.add_metric([reason], count)
            yield by_reason
        audit = self._audit
        if audit is None:
            return
        yield GaugeMetricFamily(
            AUDIT_WRITABLE,
            "1 while the audit log can be written, 0 from a failed write until one succeeds.",
            value=1 if audit.writable else 0,
        )
        yield CounterMetricFamily(
            AUDIT_FAILED_WRITES,
            "Audit log writes (or reopens) that failed; the file was left with whole lines.",
            value=audit.failed_writes,
        )
        reopens = CounterMetricFamily(
            AUDIT_REOPENS,
            "Times the audit log was reopened at its path, by reason (renamed, deleted, signal).",
            labels=("reason",),
        )
        for reason, count in sorted(dict(audit.reopens).items()):
            reopens.add_metric([reason], count)
        yield reopens
        yield CounterMetricFamily(
            AUDIT_ROTATIONS,
            "Times the audit log was rotated by size (webhook.auditMaxBytes).",
            value=audit.rotations,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
