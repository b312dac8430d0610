"""The enforcer's metrics collector: Prometheus semantics without prometheus_client's locks."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from webhook.metrics import BUCKETS, Metrics


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
