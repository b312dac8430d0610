"""The admission handler over HTTP (pytest-aiohttp), without TLS: shapes, errors, fuzz."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holdwarden.config import Config, WebhookConfig
from holdwarden.webhook.audit import AuditWriter, read_audit
from holdwarden.webhook.metrics import Metrics
from holdwarden.webhook.server import State, build_app, build_metrics_app
from tests.support.review_samples import review, trainjob, workload

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "samples" / "admissionreview"
# The captures live beside the repository (../shared), not in it; CI has them. A clone
# without them gets one explicitly skipped case saying so, not a silent empty set.
SAMPLE_NAMES = sorted(p.name for p in SAMPLES.glob("*.json")) or ["<no captures beside clone>"]
MAX_BODY = 64 * 1024
CONFIG = Config(webhook=WebhookConfig(max_body_bytes=MAX_BODY))


class Harness:
    def __init__(self, client: TestClient[Any, Any], audit: AuditWriter, metrics: Metrics) -> None:
        self.client, self.audit, self.metrics = client, audit, metrics

    async def post(self, body: Any, **kwargs: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await self.client.post("/validate", data=data, **kwargs)
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def count(
        self, decision: str, rule: str = "", resource: str = "trainjobs", op: str = "UPDATE"
    ) -> float:
        value = self.metrics.registry.get_sample_value(
            "holdwarden_webhook_reviews_total",
            {"resource": resource, "operation": op, "decision": decision, "rule": rule},
        )
        return value or 0.0


@pytest.fixture
async def hook(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[Harness]:
    audit = AuditWriter(tmp_path / "audit.jsonl")
    audit.open()
    metrics = Metrics()
    client = await aiohttp_client(build_app(CONFIG, audit, metrics))
    yield Harness(client, audit, metrics)
    audit.close()


def assert_envelope(body: dict[str, Any], uid: str) -> dict[str, Any]:
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == uid
    assert "patch" not in response and "patchType" not in response
    assert isinstance(response["allowed"], bool)
    return dict(response)


# --- real captures ------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLE_NAMES)
async def test_real_captures_are_allowed_with_uid_echoed(hook: Harness, sample: str) -> None:
    if not SAMPLES.is_dir():
        pytest.skip(f"{SAMPLES} is absent: the real captures are not beside this clone")
    raw = (SAMPLES / sample).read_bytes()
    uid = json.loads(raw)["request"]["uid"]
    status, body = await hook.post(raw, headers={"Content-Type": "application/json"})
    assert status == 200
    assert assert_envelope(body, uid)["allowed"] is True
    assert len(list(SAMPLES.glob("*.json"))) == 3


# --- decisions ------------------------------------------------------------------------------


async def test_refusal_shape_and_audit_line(hook: Harness) -> None:
    req = review(
        old=trainjob(suspend=True, instance="3"),
        new=trainjob(suspend=False, instance="3"),
        user="alice",
        groups=["devs", "system:authenticated"],
    )
    uid = req["request"]["uid"]
    status, body = await hook.post(req)
    assert status == 200
    response = assert_envelope(body, uid)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    message = response["status"]["message"]
    assert "held-trainjob-suspended" in message and "TrainJob ns/job" in message
    assert "holdwarden release ns/job --instance 3" in message
    assert response["auditAnnotations"] == {"rule": "held-trainjob-suspended", "instance": "3"}
    assert all("/" not in key for key in response["auditAnnotations"])

    records = read_audit(hook.audit.path).records
    assert len(records) == 1
    line = records[0]
    assert line["uid"] == uid and line["rule"] == "held-trainjob-suspended"
    assert line["dryRun"] is False and line["message"] == message
    assert line["user"] == "alice" and line["groups"] == ["devs", "system:authenticated"]
    assert (line["operation"], line["resource"], line["namespace"], line["name"]) == (
        "UPDATE",
        "trainjobs",
        "ns",
        "job",
    )
    assert line["instance"] == "3"
    assert (line["oldSuspend"], line["newSuspend"]) == (True, False)
    assert line["time"].endswith("Z") and "T" in line["time"]
    assert hook.count("denied", "held-trainjob-suspended") == 1


async def test_dry_run_is_judged_the_same_and_marked(hook: Harness) -> None:
    req = review(
        resource="workloads",
        old=workload(active=False, instance="2"),
        new=workload(active=True, instance="2"),
        dry_run=True,
        name="wl",
    )
    status, body = await hook.post(req)
    response = assert_envelope(body, req["request"]["uid"])
    assert status == 200 and response["allowed"] is False
    assert response["auditAnnotations"]["dryRun"] == "true"
    line = read_audit(hook.audit.path).records[-1]
    assert line["dryRun"] is True and line["rule"] == "held-workload-inactive"
    assert (line["oldActive"], line["newActive"]) == (False, True)


async def test_allowed_write_is_not_audited(hook: Harness) -> None:
    req = review(old=trainjob(suspend=True, instance="3"), new=trainjob(suspend=False))
    status, body = await hook.post(req)
    assert status == 200 and assert_envelope(body, req["request"]["uid"])["allowed"] is True
    assert read_audit(hook.audit.path).records == []
    assert hook.count("allowed") == 1


async def test_create_of_a_held_running_trainjob_is_refused(hook: Harness) -> None:
    req = review(operation="CREATE", new=trainjob(instance="1"), dry_run=True)
    _, body = await hook.post(req)
    response = assert_envelope(body, req["request"]["uid"])
    assert response["allowed"] is False
    assert response["auditAnnotations"]["rule"] == "held-trainjob-suspended"
    assert read_audit(hook.audit.path).records[-1]["oldSuspend"] is None


@pytest.mark.parametrize(
    "req",
    [
        review(operation="DELETE", old=trainjob(suspend=False, instance="1"), new=None),
        review(operation="CONNECT", old=None, new=None),
        review(
            subresource="status",
            old=trainjob(suspend=True, instance="1"),
            new=trainjob(suspend=False, instance="1"),
        ),
        review(resource="pods", old=trainjob(instance="x"), new=trainjob(instance="y")),
        review(resource="configmaps", operation="CREATE", new={"metadata": {}}),
    ],
    ids=["delete-object-null", "connect", "status-subresource", "unknown-kind", "unknown-create"],
)
async def test_not_judged_is_allowed_and_logged(
    hook: Harness, req: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="holdwarden.webhook"):
        status, body = await hook.post(req)
    assert status == 200 and assert_envelope(body, req["request"]["uid"])["allowed"] is True
    reasons = [getattr(r, "fields", {}).get("reason", "") for r in caplog.records]
    assert any("not judged" in reason for reason in reasons), reasons
    assert read_audit(hook.audit.path).records == []


# --- bad input ------------------------------------------------------------------------------

GOOD = review(old=trainjob(), new=trainjob())


def mutate(path: list[str], value: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(GOOD))
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "well-formed AdmissionReview: Expected `object`"),
        (b"null", "well-formed AdmissionReview: Expected `object`"),
        (mutate(["request"], "x"), "$.request"),
        (mutate(["request", "resource", "group"], 1), "$.request.resource.group"),
        (mutate(["apiVersion"], "admission.k8s.io/v1beta1"), "apiVersion"),
        (mutate(["kind"], "Pod"), "kind"),
        (mutate(["request"], KeyError), "no request"),
        (mutate(["request"], None), "no request"),
        (mutate(["request", "uid"], KeyError), "no uid"),
        (mutate(["request", "uid"], ""), "no uid"),
        (mutate(["request", "uid"], 7), "no uid"),
        (mutate(["request", "userInfo", "groups"], "admins"), "groups"),
        (mutate(["request", "object"], "x"), "request.object"),
        (mutate(["request", "dryRun"], "yes"), "dryRun"),
        (b'{"x":' + b"[" * 30_000 + b"]" * 30_000 + b"}", "nested deeper than 10,002 levels"),
    ],
)
async def test_bad_reviews_get_a_clear_400(hook: Harness, body: Any, needle: str) -> None:
    status, answer = await hook.post(body)
    assert status == 400
    assert answer["kind"] == "Status" and answer["code"] == 400
    assert needle in answer["message"]
    assert hook.count("invalid", resource="", op="") >= 1


async def test_oversized_body_gets_413(hook: Harness) -> None:
    big = review(old=trainjob(), new=trainjob())
    big["request"]["object"]["metadata"]["annotations"]["filler"] = "x" * (MAX_BODY + 10)
    status, answer = await hook.post(big)
    assert status == 413
    assert answer["code"] == 413 and "maxBodyBytes" in answer["message"]


async def test_oversized_chunked_body_gets_413(hook: Harness) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 1024 + 8):
            yield b" " * 1024
        yield b"{}"

    response = await hook.client.post("/validate", data=chunks())
    assert response.status == 413
    assert "maxBodyBytes" in (await response.json())["message"]


async def test_wrong_method_and_path(hook: Harness) -> None:
    assert (await hook.client.get("/validate")).status == 405
    assert (await hook.client.post("/other", data=b"{}")).status == 404
    assert (await hook.client.get("/healthz")).status == 200
    assert (await hook.client.get("/readyz")).status == 200


async def test_audit_failure_still_refuses(hook: Harness) -> None:
    hook.audit.close()  # every append now fails
    req = review(old=trainjob(suspend=True, instance="3"), new=trainjob(instance="3"))
    status, body = await hook.post(req)
    assert status == 200 and assert_envelope(body, req["request"]["uid"])["allowed"] is False
    assert (
        hook.metrics.registry.get_sample_value("holdwarden_webhook_audit_write_errors_total") == 1.0
    )


async def test_metrics_app(aiohttp_client: Any) -> None:
    metrics, state = Metrics(), State()
    client = await aiohttp_client(build_metrics_app(metrics, state))
    assert (await client.get("/readyz")).status == 503
    state.ready = True
    assert (await client.get("/readyz")).status == 200
    assert (await client.get("/healthz")).status == 200
    metrics.observe("trainjobs", "UPDATE", "denied", "kueue-owns-suspend", 0.001)
    text = await (await client.get("/metrics")).text()
    assert 'holdwarden_webhook_reviews_total{decision="denied"' in text
    assert "holdwarden_webhook_review_duration_seconds_bucket" in text
    assert "holdwarden_webhook_in_flight_requests" in text


# --- fuzz -----------------------------------------------------------------------------------
# One server per module; Hypothesis drives requests through it on a private event loop.


@pytest.fixture(scope="module")
def fuzz_target(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, TestClient[Any, Any]]]:
    loop = asyncio.new_event_loop()
    audit = AuditWriter(tmp_path_factory.mktemp("fuzz") / "audit.jsonl", fsync=False)
    audit.open()
    app = build_app(CONFIG, audit, Metrics())
    client: TestClient[Any, Any] = TestClient(TestServer(app), loop=loop)
    loop.run_until_complete(client.start_server())
    yield loop, client
    loop.run_until_complete(client.close())
    audit.close()
    loop.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

FIELDS = [
    ["request"],
    ["request", "uid"],
    ["request", "operation"],
    ["request", "resource"],
    ["request", "resource", "resource"],
    ["request", "resource", "group"],
    ["request", "subResource"],
    ["request", "userInfo"],
    ["request", "userInfo", "username"],
    ["request", "userInfo", "groups"],
    ["request", "object"],
    ["request", "object", "metadata"],
    ["request", "object", "metadata", "annotations"],
    ["request", "object", "spec"],
    ["request", "object", "spec", "suspend"],
    ["request", "oldObject"],
    ["request", "oldObject", "metadata", "annotations"],
    ["request", "dryRun"],
    ["request", "name"],
    ["request", "namespace"],
]


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    base = review(
        old=trainjob(suspend=True, instance="3", queue=draw(st.booleans())),
        new=trainjob(
            suspend=draw(st.booleans()), instance=draw(st.sampled_from([None, "3", "2", "x"]))
        ),
    )
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(FIELDS))
        target: Any = base
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target[path[-1]] = draw(json_values)
    return json.dumps(base).encode()


bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    near_valid(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_fuzz_never_500_never_crash(
    fuzz_target: tuple[Any, TestClient[Any, Any]], body: bytes
) -> None:
    loop, client = fuzz_target

    async def call() -> tuple[int, Any]:
        response = await client.post("/validate", data=body)
        return response.status, await response.json(content_type=None)

    status, answer = loop.run_until_complete(call())
    assert status in (200, 400), (status, answer)
    if status == 200:
        sent = json.loads(body)
        assert answer["response"]["uid"] == sent["request"]["uid"]
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert "patch" not in answer["response"]
    else:
        assert answer["kind"] == "Status" and answer["message"]


def test_build_app_is_an_application(tmp_path: Path) -> None:
    audit = AuditWriter(tmp_path / "a.jsonl")
    assert isinstance(build_app(CONFIG, audit, Metrics()), web.Application)


async def test_a_bug_while_judging_refuses_with_200(
    hook: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("holdwarden.webhook.server.evaluate", broken)
    req = review(old=trainjob(), new=trainjob())
    status, body = await hook.post(req)
    response = assert_envelope(body, req["request"]["uid"])
    assert status == 200 and response["allowed"] is False
    assert response["status"]["code"] == 500 and response["status"]["reason"] == "InternalError"
    assert hook.count("error") == 1


async def test_a_bug_before_the_uid_is_known_is_a_400_never_a_500(
    hook: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("holdwarden.webhook.server.parse_review", broken)
    status, body = await hook.post(review(old=trainjob(), new=trainjob()))
    assert status == 400 and "RuntimeError" in body["message"]
    # Even when answering the 400 itself fails, the answer is a 400.
    monkeypatch.setattr("holdwarden.webhook.server.Enforcer._bad", broken)
    status, body = await hook.post(review(old=trainjob(), new=trainjob()))
    assert status == 400 and body["code"] == 400
