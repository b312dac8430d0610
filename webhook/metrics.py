"""Prometheus metrics of the enforcer, in a registry of its own (not the global one), so
that tests and several servers in one process never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Admission calls should take well under the apiserver's webhook timeout (10s default);
# buckets resolve the sub-millisecond range where a healthy enforcer lives.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The enforcer's metrics. Label ``decision`` is allowed | denied | skipped | invalid |
    error; ``rule`` is the refusing rule id, or empty."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, str, str, str], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "holdwarden_webhook_reviews_total",
            "Admission reviews answered, by resource, operation, decision and rule.",
            ("resource", "operation", "decision", "rule"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "holdwarden_webhook_review_duration_seconds",
            "Time from request received to response ready (includes the audit fsync).",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "holdwarden_webhook_in_flight_requests",
            "Admission requests being handled now.",
            registry=self.registry,
        )
        self.audit_errors = Counter(
            "holdwarden_webhook_audit_write_errors_total",
            "Refusals whose audit line could not be written (the refusal was still sent).",
            registry=self.registry,
        )
        self.cert_expiry = Gauge(
            "holdwarden_webhook_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix timestamp.",
            registry=self.registry,
        )

    def track_certificate(self, not_after: Callable[[], datetime | None]) -> None:
        """Read the certificate's notAfter at every scrape (it changes on hot reload)."""

        def value() -> float:
            moment = not_after()
            return moment.timestamp() if moment is not None else float("nan")

        self.cert_expiry.set_function(value)

    def observe(
        self, resource: str, operation: str, decision: str, rule: str, seconds: float
    ) -> None:
        key = (resource, operation, decision, rule)
        child = self._children.get(key)
        if child is None:
            # labels() validates and locks on every call; the label sets are few and
            # bounded (the server maps unknown resources/operations to "other"), so cache.
            child = self._children[key] = self.reviews.labels(*key)
        child.inc()
        self.duration.observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
