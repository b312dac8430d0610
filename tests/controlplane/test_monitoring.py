"""The monitoring component: every metric an alert or the Grafana dashboard reads is one the
code exports (collected from the metrics registries, not listed by hand), every alert has
a runbook section, and the readmission gate's "waiting too long" alert reads the gate's
stall metric at its threshold."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.registry import Collector

from holdwarden.readmission import metrics as gate_metrics
from holdwarden.readmission.metrics import GateMetrics
from holdwarden.webhook import metrics as webhook_metrics
from holdwarden.webhook.audit_sinks import SinkMetrics
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
DASHBOARD = MONITORING / "dashboard.json"
RUNBOOK = ROOT / "docs" / "runbook.md"

# Series that other components export: Prometheus itself and the kube-apiserver.
EXTERNAL = frozenset({"up", "apiserver_admission_webhook_rejection_count"})

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported_metric_names() -> frozenset[str]:
    """Every series name ``holdwarden serve`` can expose on /metrics: the enforcer's
    registry with every optional part on (connections, the audit file, the stdout and
    Events sinks) and the readmission gate registered in it, as the server does."""
    served = webhook_metrics.Metrics()
    served.track_connections(lambda: (0, {}))
    served.track_audit(SimpleNamespace(writable=True, failed_writes=0, rotations=0, reopens={}))
    counts = SimpleNamespace(
        created=0, updated=0, deduplicated=0, dropped=0, failed=0, retried=0, dry_run=0
    )
    sinks: Any = SinkMetrics(
        SimpleNamespace(lines=0, late=0, dropped=0, failed=0),  # type: ignore[arg-type]
        SimpleNamespace(counts=SimpleNamespace(**vars(counts), by_error={}), queued=0),  # type: ignore[arg-type]
    )
    collector: Collector = sinks
    served.registry.register(collector)
    GateMetrics(served.registry)
    names: set[str] = set()
    for family in served.registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "inf", "nan"}
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL (or Grafana templating) expression reads.

    Drops comments, strings, label matchers, ranges, the label lists of by/without/on/
    ignoring/group_*, Grafana variables and function names; what is left and names a
    series is a metric. ``label_values(metric, label)`` reads its first argument only.
    """
    text = re.sub(r"#[^\n]*", " ", expr)
    text = re.sub(r"label_values\(\s*([^,()]+),[^)]*\)", r"\1", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', " ", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def _alerts() -> list[dict[str, Any]]:
    rules = [o for o in render(ROOT / "manifests", [MONITORING]) if o["kind"] == "PrometheusRule"]
    return [r for rule in rules for g in rule["spec"]["groups"] for r in g["rules"]]


def _dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("rate(holdwarden_webhook_reviews_total[5m])", {"holdwarden_webhook_reviews_total"}),
        (
            'sum by (rule) (rate(x_total{decision="denied", a=~"b|c"}[$__rate_interval])) * 60 > 1',
            {"x_total"},
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
        ('min by (pod) (e{namespace="$namespace"}) - time() < 14 * 24 * 3600', {"e"}),
        ('absent(up{job="holdwarden"} == 1)', {"up"}),
        (
            "(sum(increase(a_total[15m])) or vector(0)) + (sum(b) or vector(0)) > 0",
            {"a_total", "b"},
        ),
        ("label_values(holdwarden_build_info, namespace)", {"holdwarden_build_info"}),
        ("# a comment names nothing\nmax(g) < 1", {"g"}),
    ],
)
def test_metric_names_reads_the_series_an_expression_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_names_come_from_the_registries() -> None:
    exported = exported_metric_names()
    assert {
        "holdwarden_build_info",
        "holdwarden_webhook_reviews_total",
        "holdwarden_webhook_review_duration_seconds_bucket",
        "holdwarden_webhook_connections",
        "holdwarden_webhook_audit_events_total",
        "holdwarden_webhook_audit_stdout_lines_total",
        f"{gate_metrics.STALLED}",
        f"{gate_metrics.LONGEST_STALL}",
        f"{gate_metrics.DECISION_SECONDS}_bucket",
        "process_resident_memory_bytes",
    } <= exported
    # A misspelled metric is not among them (what the checks below rely on).
    assert metric_names("rate(holdwarden_webhok_reviews_total[5m])") - exported


def test_every_alert_reads_exported_metrics_and_has_a_runbook_section() -> None:
    exported = exported_metric_names() | EXTERNAL
    sections = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), flags=re.MULTILINE))
    alerts = _alerts()
    assert alerts
    for rule in alerts:
        unknown = metric_names(rule["expr"]) - exported
        assert not unknown, f"{rule['alert']} reads metrics nobody exports: {unknown}"
        assert rule["alert"] in sections, f"docs/runbook.md has no section {rule['alert']}"
        url = rule["annotations"].get("runbook_url")
        if url is not None:
            assert url == f"docs/runbook.md#{rule['alert'].lower()}"


def test_the_gate_waiting_too_long_alert() -> None:
    (rule,) = [r for r in _alerts() if r["alert"] == "HoldwardenReadmissionWaitingTooLong"]
    assert metric_names(rule["expr"]) == {gate_metrics.LONGEST_STALL}
    assert rule["expr"].endswith("> 30 * 60")
    assert rule["labels"]["severity"] == "warning"
    assert rule["annotations"]["runbook_url"].endswith("#holdwardenreadmissionwaitingtoolong")


def test_the_dashboard_is_json_and_reads_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_metric_names() | EXTERNAL
    queries = _dashboard_queries(dashboard)
    read: set[str] = set()
    for query in queries:
        names = metric_names(query)
        assert names, f"a query that reads no metric: {query}"
        assert not names - exported, f"{query} reads metrics nobody exports: {names - exported}"
        read |= names
    # What it covers: refusals and latency, connections, the certificate, the audit sinks,
    # the gate (leader, stalls, decision latency).
    for name in (
        "holdwarden_webhook_reviews_total",
        "holdwarden_webhook_review_duration_seconds_bucket",
        "holdwarden_webhook_connections",
        "holdwarden_webhook_certificate_expiry_timestamp_seconds",
        "holdwarden_webhook_audit_events_total",
        "holdwarden_readmission_leader",
        gate_metrics.STALLED,
        gate_metrics.LONGEST_STALL,
        f"{gate_metrics.DECISION_SECONDS}_bucket",
    ):
        assert name in read, name
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert len(dashboard["panels"]) <= 20, "keep it small"


def test_the_component_ships_the_dashboard_for_grafanas_sidecar_and_the_chart_the_same() -> None:
    (shipped,) = [
        o
        for o in render(ROOT / "manifests", [MONITORING])
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "holdwarden-dashboard"
    ]
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert shipped["data"] == {"holdwarden.json": DASHBOARD.read_text()}
    # Helm reads files inside the chart only: its copy must be this one
    # (tests/controlplane/test_chart.py compares the rendered ConfigMaps).
    chart_copy = ROOT / "charts" / "holdwarden" / "dashboards" / "holdwarden.json"
    assert chart_copy.read_text() == DASHBOARD.read_text()
