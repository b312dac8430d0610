"""An audit line is bounded whatever the review holds: identifying fields and digests only.

A forged 3 MB review (anyone who can reach /validate can send one) used to write a 3 MB
line; now every free-text field is capped, the objects are only digested, and what was
cut is named in ``truncated``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from holdwarden.config import Config
from holdwarden.vocabulary import RuleId
from holdwarden.webhook.audit import (
    FIELD_LIMITS,
    MAX_LINE_BYTES,
    AuditWriter,
    audit_record,
    bounded_line,
    cap_text,
    encode_line,
    object_digests,
    raw_objects,
    read_audit,
)
from holdwarden.webhook.metrics import Metrics
from holdwarden.webhook.review import APISERVER_MAX_JSON_DEPTH, Review, parse_review
from holdwarden.webhook.rules import Change, Violation
from holdwarden.webhook.server import build_app
from tests.support.review_samples import review, trainjob

MB = 1024 * 1024
BUDGET = 60.0  # seconds for any one async test
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def test_a_3mb_forged_review_writes_a_small_line(aiohttp_client: Any, tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        audit = AuditWriter(tmp_path / "audit.jsonl", fsync=False)
        audit.open()
        client = await aiohttp_client(build_app(Config(), audit, Metrics()))
        old = trainjob(suspend=True, instance="5")
        new = trainjob(suspend=False, instance="5")
        # Bulk a real apiserver would never send: a huge user, groups, name and object padding.
        new["metadata"]["managedFields"] = [{"manager": "x" * 1000}] * 1200
        req = review(
            old=old,
            new=new,
            user="system:serviceaccount:kueue-system:kueue-controller-manager" + "k" * 600_000,
            groups=["g" * 1000] * 500,
            name="n" * 100_000,
            uid="u" * 50_000,
        )
        body = json.dumps(req).encode()
        assert 2 * MB < len(body) < 3 * MB
        response = await client.post("/validate", data=body)
        assert response.status == 200
        assert (await response.json())["response"]["allowed"] is False  # still refused
        await audit.aclose()

        raw = (tmp_path / "audit.jsonl").read_bytes()
        assert raw.count(b"\n") == 1 and len(raw) <= MAX_LINE_BYTES, len(raw)
        line = json.loads(raw)
        assert line["rule"] == "held-trainjob-suspended"
        assert line["user"].startswith(
            "system:serviceaccount:kueue-system:kueue-controller-manager"
        )
        assert len(line["user"]) <= FIELD_LIMITS["user"]
        assert line["truncated"] == {
            "uid": 50_000,
            "user": len(req["request"]["userInfo"]["username"]),
            "groups": 500,
            "name": 100_000,
            "message": line["truncated"]["message"],
        }
        assert len(line["groups"]) == 16
        # Digests, not objects: each equals the SHA-256 of the object as the body carried it.
        assert line["requestBytes"] == len(body)
        assert line["oldObjectSha256"] == sha256(json.dumps(old).encode())
        assert line["objectSha256"] == sha256(json.dumps(new).encode())
        assert "managedFields" not in raw.decode()
        assert (line["kind"], line["apiGroup"]) == ("TrainJob", "trainer.kubeflow.org")
        assert (line["oldSuspend"], line["newSuspend"]) == (True, False)


async def test_malformed_huge_instance_is_capped(aiohttp_client: Any, tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        audit = AuditWriter(tmp_path / "audit.jsonl", fsync=False)
        audit.open()
        client = await aiohttp_client(build_app(Config(), audit, Metrics()))
        req = review(old=trainjob(suspend=True), new=trainjob(suspend=True, instance="9" * MB))
        response = await client.post("/validate", data=json.dumps(req).encode())
        assert (await response.json())["response"]["allowed"] is False
        await audit.aclose()
        raw = (tmp_path / "audit.jsonl").read_bytes()
        assert len(raw) <= MAX_LINE_BYTES
        line = json.loads(raw)
        assert line["rule"] == "hold-instance-malformed"
        assert line["instance"] == "9" * FIELD_LIMITS["instance"]
        assert line["truncated"]["instance"] == MB


def test_create_has_no_old_digest() -> None:
    req = review(operation="CREATE", old=None, new=trainjob(suspend=False, instance="1"))
    body = json.dumps(req).encode()
    line = audit_record(_review_of(req), _violation(), NOW, body)
    assert line["oldObjectSha256"] is None and line["oldSuspend"] is None
    assert line["objectSha256"] == sha256(json.dumps(req["request"]["object"]).encode())
    assert "truncated" not in line  # nothing was cut
    assert line["requestBytes"] == len(body)
    without_body = audit_record(_review_of(req), _violation(), NOW)
    assert without_body["requestBytes"] is None and without_body["objectSha256"] is None


def _review_of(req: dict[str, Any]) -> Review:
    from holdwarden.webhook.review import parse_review

    return parse_review(json.dumps(req).encode())


def _violation(message: str = "refused", instance: str | None = "3") -> Violation:
    return Violation(RuleId("held-trainjob-suspended"), message, instance)


def test_cap_text_counts_encoded_bytes() -> None:
    assert cap_text("abc", 3) == ("abc", False)
    assert cap_text("abcd", 3) == ("abc", True)
    # ensure_ascii: "é" is 6 bytes (\u00e9), an emoji 12 (a surrogate pair), a quote 2.
    assert cap_text("éé", 6) == ("é", True)
    assert cap_text("\U0001f600", 11) == ("", True)
    assert cap_text('""', 3) == ('"', True)
    assert cap_text("", 0) == ("", False)


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=3000) | st.builds(
    lambda c, n: c * n, st.characters(codec="utf-8"), st.integers(0, 20_000)
)


@settings(max_examples=150, deadline=None)
@given(
    uid=_text,
    user=_text,
    groups=st.lists(_text, max_size=40),
    namespace=_text,
    name=_text,
    operation=_text,
    message=_text,
    instance=st.none() | _text,
)
def test_any_review_gives_a_bounded_line(
    uid: str,
    user: str,
    groups: list[str],
    namespace: str,
    name: str,
    operation: str,
    message: str,
    instance: str | None,
) -> None:
    change = Change(
        group="trainer.kubeflow.org",
        resource="trainjobs",
        subresource="",
        operation=operation,
        namespace=namespace,
        name=name,
        username=user,
        groups=tuple(groups),
        old=None,
        new={"spec": {"suspend": False}},
    )
    rec = audit_record(
        Review(uid or "u", False, change, "v1alpha1", ""), _violation(message, instance), NOW
    )
    line = bounded_line(rec)
    assert len(line) <= MAX_LINE_BYTES and line.count(b"\n") == 1
    assert line == encode_line(rec)  # no stand-in needed for what audit_record makes
    back = json.loads(line)
    for key, original in (("user", user), ("namespace", namespace), ("name", name)):
        assert original.startswith(back[key])
        assert (back[key] == original) == (key not in back.get("truncated", {}))


def test_a_record_not_made_by_audit_record_is_still_bounded() -> None:
    rec = {"time": "t", "uid": "u", "rule": "r", "message": "m" * MB}
    line = bounded_line(rec)
    assert len(line) <= MAX_LINE_BYTES
    whole = len(encode_line(rec))
    assert json.loads(line) == {"time": "t", "uid": "u", "rule": "r", "truncated": {"line": whole}}


async def test_audit_reads_bounded_and_old_lines_together(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET):
        path = tmp_path / "audit.jsonl"
        old_style = {
            "time": "2026-12-02T11:00:00Z",
            "uid": "old",
            "rule": "kueue-owns-suspend",
            "message": "whole message",
            "user": "bob",
            "namespace": "ns",
            "name": "job",
        }
        path.write_bytes(encode_line(old_style))
        writer = AuditWriter(path, fsync=False)
        writer.open()
        req = review(
            old=trainjob(suspend=True, instance="2"), new=trainjob(instance="2"), uid="new"
        )
        await writer.append(
            audit_record(_review_of(req), _violation(), NOW, json.dumps(req).encode())
        )
        await writer.aclose()
        assert [r["uid"] for r in read_audit(path, namespace="ns").records] == ["old", "new"]
        assert [r["uid"] for r in read_audit(path, user="bob").records] == ["old"]


def _digest(data: bytes) -> str | None:
    return None if data in (b"", b"null") else sha256(data)


def test_a_refusal_as_deep_as_the_apiserver_stores_digests_the_objects_as_carried() -> None:
    # msgspec cannot skip into msgspec.Raw this deep on 3.12 (nor on 3.11 with its default
    # recursion limit): the digests come from raw_objects, and are the objects' own bytes.
    old = trainjob(suspend=True, instance="3")
    new = trainjob(instance="3")
    new["spec"]["extra"] = "__deep__"
    levels = APISERVER_MAX_JSON_DEPTH - 2  # the object, its spec, then the lists
    new_text = json.dumps(new).replace('"__deep__"', "[" * levels + "]" * levels)
    req = review(old=old, new=None)
    req["request"]["object"] = "__new__"
    body = json.dumps(req).replace('"__new__"', new_text).encode()
    parsed = parse_review(body)
    assert parsed.change.new is not None and parsed.change.new["spec"] == {}  # not suspended
    line = audit_record(parsed, _violation(), NOW, body)
    assert line["objectSha256"] == sha256(new_text.encode())
    assert line["oldObjectSha256"] == sha256(json.dumps(old).encode())
    assert raw_objects(body) == (json.dumps(old).encode(), new_text.encode())


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='{}[]":,\\ xé', max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["object", "oldObject", "request", "a"]), inner, max_size=3
        )
    ),
    max_leaves=10,
)
# Spellings of the keys msgspec matches, escaped ones included.
_KEYS = ["object", "oldObject", "obj\\u0065ct", "request", "requ\\u0065st", "uid", "other"]


@st.composite
def _json_text(draw: st.DrawFn, depth: int = 0) -> str:
    """JSON text whose objects may repeat keys and spell them escaped, spaced at random."""
    space = draw(st.sampled_from(["", " ", "\n  ", "\t"]))
    if depth < 3 and draw(st.booleans()):
        pairs = draw(st.lists(st.sampled_from(_KEYS), max_size=4))
        items = [f'"{key}"{space}:{space}{draw(_json_text(depth + 1))}' for key in pairs]
        return "{" + space + f",{space}".join(items) + space + "}"
    return json.dumps(draw(_values), indent=draw(st.sampled_from([None, 1])))


class _RawRequest(msgspec.Struct):
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    oldObject: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class _RawReview(msgspec.Struct):
    request: _RawRequest | None = None


@settings(max_examples=300, deadline=None)
@given(text=_json_text())
def test_raw_objects_finds_what_msgspec_finds(text: str) -> None:
    body = text.encode()
    try:
        request = msgspec.json.decode(body, type=_RawReview).request
    except msgspec.ValidationError:
        # raw_objects reads bodies parse_review accepted: a request that is an object.
        assume(False)
        raise
    expected = (b"", b"") if request is None else (bytes(request.oldObject), bytes(request.object))
    assert raw_objects(body) == expected
    assert object_digests(body) == tuple(_digest(raw) for raw in expected)
