"""The enforcer's metrics collector: Prometheus semantics without prometheus_client's locks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.webhook.metrics import BUCKETS, Metrics


@given(st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=50))
def test_histogram_is_cumulative_and_exact(durations: list[float]) -> None:
    metrics = Metrics()
    for seconds in durations:
        metrics.observe("trainjobs", "UPDATE", "allowed", "", seconds)
    sample = metrics.registry.get_sample_value
    for bound in BUCKETS:
        expected = sum(1 for d in durations if d <= bound)
        got = sample("holdwarden_webhook_review_duration_seconds_bucket", {"le": str(bound)})
        assert got == expected
    assert sample("holdwarden_webhook_review_duration_seconds_bucket", {"le": "+Inf"}) == len(
        durations
    )
    assert sample("holdwarden_webhook_review_duration_seconds_count") == len(durations)
    total = sample("holdwarden_webhook_review_duration_seconds_sum")
    assert total is not None and abs(total - sum(durations)) < 1e-9
    labels = {"resource": "trainjobs", "operation": "UPDATE", "decision": "allowed", "rule": ""}
    assert (sample("holdwarden_webhook_reviews_total", labels) or 0) == len(durations)


def test_gauges_and_certificate_expiry() -> None:
    metrics = Metrics()
    metrics.in_flight.inc()
    metrics.in_flight.inc()
    metrics.in_flight.dec()
    metrics.audit_errors.inc()
    sample = metrics.registry.get_sample_value
    assert sample("holdwarden_webhook_in_flight_requests") == 1
    assert sample("holdwarden_webhook_audit_write_errors_total") == 1
    expiry = sample("holdwarden_webhook_certificate_expiry_timestamp_seconds")
    assert expiry is not None and expiry != expiry  # NaN until a certificate is tracked
    moment = datetime(2027, 1, 1, tzinfo=UTC)
    metrics.track_certificate(lambda: moment)
    assert sample("holdwarden_webhook_certificate_expiry_timestamp_seconds") == moment.timestamp()
    text = metrics.exposition().decode()
    assert "# TYPE holdwarden_webhook_reviews_total counter" in text
    assert "# TYPE holdwarden_webhook_review_duration_seconds histogram" in text


def test_every_reviews_series_exists_from_the_start_with_build_and_process_metrics() -> None:
    """Before the first review, rate() has a series to read for every resource, operation,
    decision and rule; build_info names the version; the process and Python collectors
    are in the registry the server serves."""
    from prometheus_client import generate_latest

    from holdwarden.vocabulary import RuleId

    metrics = Metrics()
    registry = metrics.registry
    for rule in RuleId:
        labels = {"resource": "workloads", "operation": "UPDATE", "decision": "denied",
                  "rule": str(rule)}  # fmt: skip
        assert registry.get_sample_value("holdwarden_webhook_reviews_total", labels) == 0.0
    allowed = {"resource": "trainjobs", "operation": "CREATE", "decision": "allowed", "rule": ""}
    assert registry.get_sample_value("holdwarden_webhook_reviews_total", allowed) == 0.0
    text = generate_latest(registry).decode()
    assert 'holdwarden_build_info{python="' in text and 'version="' in text
    assert "process_resident_memory_bytes" in text
    assert "python_info" in text and "python_gc_objects_collected_total" in text
    metrics.observe("trainjobs", "CREATE", "allowed", "", 0.001)
    assert registry.get_sample_value("holdwarden_webhook_reviews_total", allowed) == 1.0


async def test_the_metrics_port_logs_no_scrape(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import urllib.request

    from tests.support.enforcer_tls import serving

    async with serving(tmp_path) as served:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.access"):
            url = f"http://127.0.0.1:{served.server.metrics_port}/metrics"
            for _ in range(3):
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=5).read()
                )
                assert b"holdwarden_webhook_reviews_total" in body
    assert not [r for r in caplog.records if r.name == "aiohttp.access"], caplog.records
