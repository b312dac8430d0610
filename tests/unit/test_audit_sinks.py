"""The audit sinks' pure parts (table tests and properties) and the Events sink's queue,
dedup, limiter and drain with an in-memory Events client (no API server: the write path
against the real apiserver is tests/controlplane/test_audit_events_e2e.py)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden.config import AuditEventsConfig, Config, ConfigError
from holdwarden.vocabulary import RuleId, event_reason, rule_of_event_reason
from holdwarden.webhook.audit import AuditFilter, is_audit_record, read_audit_stream
from holdwarden.webhook.audit_sinks import (
    EVENT_WRITE_ATTEMPTS,
    NOTE_LIMIT,
    EventLabels,
    EventsApiError,
    EventsSink,
    SeriesCache,
    StdoutSink,
    TokenBucket,
    dedup_key,
    event_body,
    event_name,
    record_from_event,
    series_patch,
    stdout_line,
    truncate_note,
)
from tests.support.audit_helpers import record

LABELS = EventLabels("holdwarden.io")
T0 = datetime(2026, 12, 3, 9, 0, 0, 123456, tzinfo=UTC)

# --- configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("webhook", "key", "words"),
    [
        pytest.param({"auditSinks": []}, "webhook.auditSinks", "at least one", id="empty"),
        pytest.param({"auditSinks": ["syslog"]}, "webhook.auditSinks", "not a sink", id="unknown"),
        pytest.param({"auditSinks": ["file", "file"]}, "webhook.auditSinks", "twice", id="twice"),
        pytest.param({"auditSinks": "stdout"}, "webhook.auditSinks", "list", id="not-a-list"),
        pytest.param({"auditEvents": {"qps": 0}}, "webhook.auditEvents.qps", "above 0", id="qps"),
        pytest.param({"auditEvents": {"qps": True}}, "webhook.auditEvents.qps", "number", id="b"),
        pytest.param({"auditEvents": {"burst": 0}}, "webhook.auditEvents.burst", "1", id="burst"),
        pytest.param(
            {"auditEvents": {"queueSize": 0}}, "webhook.auditEvents.queueSize", "1", id="queue"
        ),
        pytest.param(
            {"auditEvents": {"window": "0s"}}, "webhook.auditEvents.window", "zero", id="window"
        ),
        pytest.param(
            {"auditEvents": {"requestTimeout": "soon"}},
            "webhook.auditEvents.requestTimeout",
            "duration",
            id="timeout",
        ),
        pytest.param({"auditEvents": {"rate": 1}}, "webhook.auditEvents.rate", "unknown", id="key"),
    ],
)
def test_bad_sink_configuration_names_the_key(
    webhook: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_dict({"webhook": webhook})
    assert caught.value.key == key and words in str(caught.value)


def test_sink_configuration_defaults_and_values() -> None:
    assert Config().webhook.audit_sinks == ("file",)
    config = Config.from_dict(
        {
            "webhook": {
                "auditSinks": ["stdout", "events"],
                "auditEvents": {"qps": 2.5, "burst": 3, "queueSize": 7, "window": "1m"},
            }
        }
    )
    assert config.webhook.audit_sinks == ("stdout", "events")
    assert config.webhook.audit_events == AuditEventsConfig(
        window=timedelta(minutes=1), qps=2.5, burst=3, queue_size=7
    )


# --- pure parts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "same"),
    [
        pytest.param({"uid": "other", "time": "later", "instance": "9"}, True, id="uid-time"),
        pytest.param({"message": "different words"}, True, id="message"),
        pytest.param({"user": "bob"}, False, id="user"),
        pytest.param({"rule": "hold-instance-monotonic"}, False, id="rule"),
        pytest.param({"name": "other-job"}, False, id="name"),
        pytest.param({"namespace": "other-ns"}, False, id="namespace"),
        pytest.param({"resource": "workloads"}, False, id="resource"),
        pytest.param({"operation": "CREATE"}, False, id="operation"),
    ],
)
def test_dedup_key(change: dict[str, Any], same: bool) -> None:
    assert (dedup_key(record("a")) == dedup_key({**record("a"), **change})) is same


@pytest.mark.parametrize(
    ("rate", "burst", "steps", "taken"),
    [
        # (seconds since start, tried) -> how many were taken
        pytest.param(1.0, 3, [(0.0, 5)], 3, id="burst-then-empty"),
        pytest.param(1.0, 3, [(0.0, 3), (1.0, 5)], 4, id="one-a-second"),
        pytest.param(2.0, 1, [(0.0, 1), (0.25, 1), (0.5, 1)], 2, id="half-token-not-enough"),
        pytest.param(10.0, 2, [(0.0, 2), (100.0, 10)], 4, id="refill-capped-at-burst"),
    ],
)
def test_token_bucket(rate: float, burst: int, steps: list[tuple[float, int]], taken: int) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    got = 0
    for moment, tries in steps:
        got += sum(bucket.take(moment) for _ in range(tries))
    assert got == taken


def test_token_bucket_delay_says_when_the_next_token_comes() -> None:
    bucket = TokenBucket(4.0, 1, now=10.0)
    assert bucket.delay(10.0) == 0.0 and bucket.take(10.0)
    assert bucket.delay(10.0) == pytest.approx(0.25)
    assert not bucket.take(10.2) and bucket.take(10.25)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 100.0),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_token_bucket_never_exceeds_burst_plus_rate_times_t(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst, now=0.0)
    now, taken = 0.0, 0
    for gap in gaps:
        now += gap
        taken += bucket.take(now)
        assert taken <= burst + rate * now + 1e-9


def test_series_cache_forgets_after_the_window_and_beyond_capacity() -> None:
    from holdwarden.webhook.audit_sinks import Series

    cache = SeriesCache(window=60.0, capacity=2)
    key_a, key_b, key_c = (dedup_key(record("x", name=n)) for n in "abc")
    cache.put(key_a, Series("a.1", "ns", 1, written=0.0))
    assert cache.get(key_a, 59.9) is not None
    assert cache.get(key_a, 60.0) is None  # a new Event after the window
    cache.put(key_a, Series("a.1", "ns", 1, written=100.0))
    cache.put(key_b, Series("b.1", "ns", 1, written=101.0))
    cache.put(key_c, Series("c.1", "ns", 1, written=102.0))
    assert len(cache) == 2 and cache.get(key_a, 103.0) is None  # the oldest went


@pytest.mark.parametrize(
    ("message", "limit", "expected"),
    [
        pytest.param("short", 1024, "short", id="fits"),
        pytest.param("x" * 1024, 1024, "x" * 1024, id="exactly"),
        pytest.param("x" * 1025, 1024, "x" * 1021 + "...", id="cut"),
        pytest.param("é" * 600, 1024, "é" * 510 + "...", id="multibyte-boundary"),
    ],
)
def test_truncate_note(message: str, limit: int, expected: str) -> None:
    note = truncate_note(message, limit)
    assert note == expected and len(note.encode()) <= limit


@pytest.mark.parametrize(
    ("fields", "count", "check"),
    [
        pytest.param({}, 1, {"series": None, "metadata.namespace": "ns"}, id="first"),
        pytest.param(
            {},
            3,
            {"series.count": 3, "series.lastObservedTime": "2026-12-03T09:00:05.123456Z"},
            id="series",
        ),
        pytest.param(
            {"resource": "trainjobs", "apiGroup": "trainer.kubeflow.org", "kind": "TrainJob"},
            1,
            {"regarding.apiVersion": "trainer.kubeflow.org/v1alpha1", "regarding.kind": "TrainJob"},
            id="trainjob",
        ),
        pytest.param(
            {"resource": "workloads", "apiGroup": "kueue.x-k8s.io", "kind": "Workload"},
            1,
            {"regarding.apiVersion": "kueue.x-k8s.io/v1beta2", "action": "RefuseUpdate"},
            id="workload",
        ),
        pytest.param(
            {"namespace": None},
            1,
            {"metadata.namespace": "default", "regarding.namespace": ""},
            id="no-namespace",
        ),
        pytest.param({"message": "m" * 5000}, 1, {"note.bytes": NOTE_LIMIT}, id="long-note"),
        pytest.param({"operation": "DELETE"}, 1, {"action": "RefuseDelete"}, id="delete"),
    ],
)
def test_event_body(fields: dict[str, Any], count: int, check: dict[str, Any]) -> None:
    rec = record("u1", **fields)
    body = event_body(
        rec, name="job.0123", count=count, first=T0, last=T0 + timedelta(seconds=5),
        instance="holdwarden-0", labels=LABELS,
    )  # fmt: skip
    assert body["reason"] == event_reason(rec["rule"]) and body["type"] == "Warning"
    assert body["reason"][0].isupper() and "-" not in body["reason"]
    assert body["reportingController"] == "holdwarden.io/enforcer"
    assert body["reportingInstance"] == "holdwarden-0"
    assert body["eventTime"] == "2026-12-03T09:00:00.123456Z"
    assert body["metadata"]["labels"] == {"holdwarden.io/audit": "refusal"}
    for path, wanted in check.items():
        if path == "note.bytes":
            assert len(body["note"].encode()) == wanted
            continue
        value: Any = body
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        assert value == wanted, path


def test_an_event_reads_back_as_its_record() -> None:
    rec = record("u1", instance="7", apiGroup="trainer.kubeflow.org", kind="TrainJob")
    body = event_body(
        rec, name="job.1", count=4, first=T0, last=T0 + timedelta(minutes=1), instance="i",
        labels=LABELS,
    )  # fmt: skip
    back = record_from_event(body, LABELS)
    for name in ("rule", "message", "user", "operation", "instance", "uid", "namespace", "name"):
        assert back[name] == rec[name], name
    assert back["count"] == 4 and back["time"] == "2026-12-03T09:01:00.123456Z"
    assert back["firstTime"] == "2026-12-03T09:00:00.123456Z"
    assert back["apiGroup"] == "trainer.kubeflow.org" and back["kind"] == "TrainJob"
    assert AuditFilter(namespace="ns", user="alice").matches(back)
    assert series_patch(5, T0) == {
        "series": {"count": 5, "lastObservedTime": "2026-12-03T09:00:00.123456Z"}
    }


def test_event_names_are_dns_subdomains_unique_per_key_and_time() -> None:
    key = dedup_key(record("a"))
    name = event_name("My-Job", key, T0)
    assert name.startswith("my-job.") and len(name) == len("my-job.") + 16
    assert name != event_name("My-Job", key, T0 + timedelta(microseconds=1))
    assert len(event_name("x" * 300, key, T0)) <= 253
    assert event_name("", key, T0).startswith("refusal.")


# --- the stdout line and reading mixed streams ------------------------------------------


def test_stdout_line_is_the_record_marked_first() -> None:
    rec = record("u1")
    line = stdout_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"audit":true,')
    assert json.loads(line) == {"audit": True, **rec}


@pytest.mark.parametrize(
    ("obj", "is_record"),
    [
        pytest.param({"audit": True, "rule": "r"}, True, id="stdout-line"),
        pytest.param({"rule": "r", "uid": "u"}, True, id="file-line"),
        pytest.param(
            {"level": "info", "logger": "holdwarden", "msg": "refused", "rule": "r"},
            False,
            id="our-log-line",
        ),
        pytest.param({"audit": False, "rule": "r"}, False, id="marker-false"),
        pytest.param({"msg": "hello"}, False, id="someone-elses-json"),
    ],
)
def test_is_audit_record(obj: dict[str, Any], is_record: bool) -> None:
    assert is_audit_record(obj) is is_record


def test_a_mixed_stream_yields_only_audit_records() -> None:
    lines = [
        b'{"time":"t","level":"info","logger":"holdwarden.webhook","msg":"refused","rule":"r"}\n',
        stdout_line(record("one")),
        b"not json at all\n",
        stdout_line(record("two", namespace="other")),
        json.dumps(record("three")).encode() + b"\n",
    ]
    result = read_audit_stream(lines, AuditFilter(namespace="ns"))
    assert [r["uid"] for r in result.records] == ["one", "three"]
    assert "audit" not in result.records[0]
    assert result.other == 1 and result.skipped == 1


async def test_stdout_sink_writes_whole_lines_and_does_not_wait_on_a_blocked_pipe() -> None:
    read_fd, write_fd = os.pipe()
    sink = StdoutSink(write_fd, wait=0.2)
    sink.open()
    try:
        # Nobody reads: the pipe (64 KiB) fills, then appends come back after ``wait``.
        started = time.monotonic()
        big = record("b", message="é" * 400)
        for i in range(40):
            await sink.append({**big, "uid": f"u{i}"})
        assert sink.late >= 1
        assert time.monotonic() - started < 40 * 0.2 + 5  # each waited at most ``wait``
        # Now drain it: every line arrives whole, in order.
        data = bytearray()

        def drain() -> None:
            while True:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    return
                data.extend(chunk)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        await sink.aclose(timeout=10)
        os.close(write_fd)
        write_fd = -1
        reader.join(10)
        lines = bytes(data).split(b"\n")
        assert lines[-1] == b""
        assert [json.loads(line)["uid"] for line in lines[:-1]] == [f"u{i}" for i in range(40)]
        assert sink.lines == 40 and sink.dropped == 0
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)


# --- the Events sink with an in-memory client -------------------------------------------


class MemoryEvents:
    """Records calls; ``fail`` makes every call raise; ``gate`` blocks calls until set."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[float, str]] = []
        self.fail: int | None = None
        self.gate = threading.Event()
        self.gate.set()

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self._call("create")
        self.events[(namespace, body["metadata"]["name"])] = body

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._call("patch")
        if (namespace, name) not in self.events:
            raise EventsApiError(404, "not found")
        self.events[(namespace, name)].update(body)

    def _call(self, what: str) -> None:
        assert self.gate.wait(10)
        self.calls.append((time.monotonic(), what))
        if self.fail is not None:
            raise EventsApiError(self.fail, "refused")


def events_sink(client: MemoryEvents, **settings: Any) -> EventsSink:
    config = AuditEventsConfig(**{"qps": 1000.0, "burst": 1000, **settings})
    return EventsSink(config, client, annotation_prefix="holdwarden.io", instance="test-0")


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_identical_refusals_become_one_event_with_their_count() -> None:
    client = MemoryEvents()
    client.gate.clear()  # hold the first write, so the rest fold into the queue
    sink = events_sink(client)
    sink.open()
    try:
        for i in range(5):
            sink.offer(record(f"u{i}"))
        sink.offer(record("other", name="another-job"))
        await asyncio.sleep(0.05)
        client.gate.set()
        await until(
            lambda: sum(e.get("series", {}).get("count", 1) for e in client.events.values()) == 6
        )
        for i in range(5, 8):  # later ones update the same Event's series
            sink.offer(record(f"u{i}"))
        await until(lambda: sink.counts.updated >= 1 and not sink.queued)
    finally:
        await sink.aclose(timeout=5)
    by_name = {body["regarding"]["name"]: body for body in client.events.values()}
    assert set(by_name) == {"job", "another-job"}
    assert by_name["job"]["series"]["count"] == 8
    assert "series" not in by_name["another-job"]
    assert sink.counts.created == 2 and sink.counts.deduplicated == 7


async def test_dry_runs_are_never_events_and_a_full_queue_drops_and_counts() -> None:
    client = MemoryEvents()
    client.gate.clear()
    sink = events_sink(client, queue_size=2)
    sink.open()
    try:
        sink.offer(record("dry", dryRun=True))
        sink.offer(record("a", name="a"))
        await until(lambda: sink.queued == 0)  # "a" is in flight, blocked on the gate
        started = time.monotonic()
        for name in ("b", "c", "d", "e"):
            sink.offer(record(name, name=name))
        assert time.monotonic() - started < 0.5  # offer never waits on the API
        assert sink.queued == 2 and sink.counts.dropped == 2
        client.gate.set()
        await until(lambda: sink.counts.created == 3)
    finally:
        await sink.aclose(timeout=5)
    assert sink.counts.dry_run == 1
    assert {b["regarding"]["name"] for b in client.events.values()} == {"a", "b", "c"}


async def test_writes_are_rate_limited() -> None:
    client = MemoryEvents()
    sink = events_sink(client, qps=10.0, burst=2)
    sink.open()
    started = time.monotonic()
    try:
        for i in range(6):
            sink.offer(record(str(i), name=f"job-{i}"))
        await until(lambda: len(client.calls) == 6)
    finally:
        await sink.aclose(timeout=5)
    for moment, _ in client.calls:
        taken = sum(1 for m, _ in client.calls if m <= moment)
        assert taken <= 2 + 10.0 * (moment - started) + 1  # +1: scheduling jitter
    assert client.calls[-1][0] - started >= (6 - 2) / 10.0 - 0.05


async def test_api_failures_are_counted_and_a_lost_event_is_made_again() -> None:
    client = MemoryEvents()
    client.fail = 403
    sink = events_sink(client)
    sink.open()
    try:
        sink.offer(record("a"))
        sink.offer(record("b"))  # folds into "a" if still queued, else a second write
        await until(lambda: sink.counts.failed == 2)
        assert set(sink.counts.by_error) == {"403"} and sink.counts.by_error["403"] >= 1
        client.fail = None
        sink.offer(record("c"))
        await until(lambda: sink.counts.created == 1)
        client.events.clear()  # the Event expired (its TTL) or was deleted
        sink.offer(record("d"))
        await until(lambda: sink.counts.created == 2)
    finally:
        await sink.aclose(timeout=5)
    (body,) = client.events.values()
    assert "series" not in body  # a fresh Event, not a patch of the lost one


async def test_close_drains_the_queue_within_its_timeout() -> None:
    client = MemoryEvents()
    sink = events_sink(client, qps=1000.0, burst=1000)
    sink.open()
    for i in range(20):
        sink.offer(record(str(i), name=f"job-{i}"))
    await sink.aclose(timeout=5)
    assert sink.counts.created == 20 and sink.counts.dropped == 0
    sink.offer(record("late"))
    assert sink.counts.dropped == 1  # after close, counted, never queued

    stuck = MemoryEvents()
    stuck.gate.clear()
    slow = events_sink(stuck, qps=1000.0, burst=1000)
    slow.open()
    for i in range(3):
        slow.offer(record(str(i), name=f"job-{i}"))
    started = time.monotonic()
    await slow.aclose(timeout=0.3)
    assert time.monotonic() - started < 2
    assert slow.counts.dropped == 2  # one was in flight on the stuck call
    stuck.gate.set()


def test_the_install_guide_gives_the_tested_apiserver_audit_policy() -> None:
    """docs/install.md repeats the audit Policy that tests/controlplane/test_audit_apiserver.py
    runs the apiserver with (from docs/explanation/audit-trail.md), word for word."""
    import re

    from tests.controlplane.test_audit_apiserver import documented_policy

    text = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "kind: Policy" in b]
    assert blocks == [documented_policy()]


def test_serve_with_the_events_sink_and_no_credentials_says_which_and_exits(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "holdwarden.cli", "serve", "--listen", "127.0.0.1:0",
               "--metrics", "127.0.0.1:0", "--cert-dir", str(tmp_path),
               "--audit-sink", "stdout", "--audit-sink", "events"]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "absent")}
    done = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert json.loads(line)["error"] == f"$KUBECONFIG={tmp_path / 'absent'}: no such file"
    bad = subprocess.run(
        [*command[:-4], "--audit-sink", "syslog"], cwd=root, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'syslog'" in bad.stderr


class LandingTimeouts(MemoryEvents):
    """A server that applies a write and then the client times out (status 0), for the
    first ``landed`` calls; or fails before applying for ``lost`` calls (as scripted)."""

    def __init__(self, script: list[str]) -> None:
        super().__init__()
        self.script = list(script)  # per call: "ok" | "landed" | "lost" | "403"

    def _outcome(self) -> str:
        return self.script.pop(0) if self.script else "ok"

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        outcome = self._outcome()
        if outcome in ("lost", "403"):
            raise EventsApiError(403 if outcome == "403" else 0, outcome)
        if (namespace, body["metadata"]["name"]) in self.events:
            raise EventsApiError(409, "already exists")
        self.events[(namespace, body["metadata"]["name"])] = body
        if outcome == "landed":
            raise EventsApiError(0, "ReadTimeoutError: the answer never came")

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        outcome = self._outcome()
        if outcome in ("lost", "403"):
            raise EventsApiError(403 if outcome == "403" else 0, outcome)
        if (namespace, name) not in self.events:
            raise EventsApiError(404, "not found")
        self.events[(namespace, name)].update(body)
        if outcome == "landed":
            raise EventsApiError(0, "ReadTimeoutError: the answer never came")

    def total(self) -> int:
        return sum(int(e.get("series", {}).get("count", 1)) for e in self.events.values())


async def test_a_write_that_landed_after_its_timeout_loses_no_refusal() -> None:
    """Before: a patch that timed out (but landed) counted its refusals as failed and left
    the cached count behind, so 6 identical refusals could leave series.count at 5; a
    create that landed was made again. Now every write carries the whole total."""
    client = LandingTimeouts(["landed", "landed", "lost", "landed"])
    sink = events_sink(client)
    sink.open()
    try:
        for i in range(6):
            sink.offer(record(f"u{i}"))
            await until(lambda: not sink.queued)  # one at a time, as the e2e test sends
        await until(lambda: client.total() == 6 and sink.idle, 60)
    finally:
        await sink.aclose(timeout=5)
    (event,) = client.events.values()
    assert event["series"]["count"] == 6
    # The create landed (retried: 409, so patched), a patch was lost, one landed: 3 retries.
    assert sink.counts.failed == 0 and sink.counts.retried == 3
    assert sink.counts.by_error == {"unreachable": 3} and sink.counts.created == 1


async def test_a_refused_write_is_not_retried_and_its_refusals_count_as_failed() -> None:
    client = LandingTimeouts(["403"])
    sink = events_sink(client)
    sink.open()
    try:
        sink.offer(record("a"))
        await until(lambda: sink.counts.failed == 1)
        sink.offer(record("b"))
        await until(lambda: sink.counts.created == 1)
    finally:
        await sink.aclose(timeout=5)
    assert sink.counts.retried == 0 and client.total() == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["ok", "landed", "lost", "403"]), max_size=12),
    st.integers(min_value=1, max_value=12),
)
async def test_property_the_events_never_overcount_and_nothing_is_lost_silently(
    script: list[str], refusals: int
) -> None:
    client = LandingTimeouts(script)
    sink = events_sink(client)
    sink.open()
    try:
        for i in range(refusals):
            sink.offer(record(f"u{i}"))
            await asyncio.sleep(0)
        await until(lambda: sink.idle and sink.counts.created + sink.counts.failed > 0, 60)
        await until(lambda: sink.idle, 60)
    finally:
        await sink.aclose(timeout=5)
    shown = client.total()
    assert shown <= refusals, "an Event never says more refusals than there were"
    assert shown + sink.counts.failed + sink.counts.dropped >= refusals, "none lost silently"
    if "403" not in script and script.count("lost") + script.count("landed") < (
        EVENT_WRITE_ATTEMPTS
    ):
        assert shown == refusals  # fewer transient failures than attempts: exact


@pytest.mark.parametrize("rule", list(RuleId))
def test_event_reasons_are_upper_camel_case_and_read_back_as_rule_ids(rule: RuleId) -> None:
    reason = event_reason(rule)
    assert reason[0].isupper() and reason.isalnum(), reason
    assert rule_of_event_reason(reason) == str(rule)
    assert rule_of_event_reason(str(rule)) == str(rule)  # an Event an older build wrote


def test_a_record_without_a_rule_is_reason_refused() -> None:
    assert event_reason(None) == "Refused" and rule_of_event_reason("Refused") is None
