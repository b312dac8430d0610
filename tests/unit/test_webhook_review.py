"""The fast typed parser sees exactly what a full JSON parse sees, as far as the rules go;
the slow path, taken for bodies nested deeper than msgspec goes, gives the same Review."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden.config import Config
from holdwarden.vocabulary import QUEUE_NAME_LABEL, Annotations
from holdwarden.webhook.review import (
    APISERVER_MAX_JSON_DEPTH,
    MAX_READ_DEPTH,
    MAX_REVIEW_DEPTH,
    BadReview,
    Review,
    allow,
    allow_bytes,
    deny,
    parse_review,
)
from holdwarden.webhook.rules import Change, RulesConfig, Violation, evaluate
from tests.support.review_samples import inflate, review, trainjob, workload

A = Annotations()
CONFIG = RulesConfig.from_config(Config())
KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"


def full_change(doc: dict[str, Any]) -> Change:
    """The Change built from a complete stdlib parse (the reference)."""
    req = doc["request"]
    return Change(
        group=req["resource"]["group"],
        resource=req["resource"]["resource"],
        subresource=req.get("subResource") or "",
        operation=req["operation"],
        namespace=req["namespace"],
        name=req["name"],
        username=req["userInfo"]["username"],
        groups=tuple(req["userInfo"]["groups"]),
        old=req["oldObject"],
        new=req["object"],
    )


scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.text(max_size=4))
annotation_values = st.one_of(st.sampled_from(["1", "2", "10", "01", "", "x"]), st.text(max_size=3))


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    annotations = draw(
        st.dictionaries(st.sampled_from([*A.hold_keys, "other"]), annotation_values, max_size=4)
    )
    meta: dict[str, Any] = {"name": "job", "annotations": annotations}
    if draw(st.booleans()):
        meta["labels"] = {QUEUE_NAME_LABEL: "q"}
    if draw(st.booleans()):
        meta["ownerReferences"] = [
            {"kind": "TrainJob", "name": draw(st.text(min_size=1, max_size=4))}
        ]
    spec: dict[str, Any] = {"runtimeRef": {"name": "r"}, "podSets": [{"name": "n", "count": 1}]}
    for key in ("suspend", "active"):
        if draw(st.booleans()):
            spec[key] = draw(scalar)
    obj = {"apiVersion": "x/v1", "kind": "K", "metadata": meta, "spec": spec}
    return inflate(obj, 3000) if draw(st.booleans()) else obj


@settings(max_examples=300, deadline=None)
@given(
    old=st.one_of(st.none(), objects()),
    new=objects(),
    resource=st.sampled_from(["trainjobs", "workloads"]),
    user=st.sampled_from(["alice", KUEUE]),
    sub=st.sampled_from([None, "status"]),
    dry=st.booleans(),
)
def test_typed_parse_agrees_with_a_full_parse(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    resource: str,
    user: str,
    sub: str | None,
    dry: bool,
) -> None:
    doc = review(
        resource=resource,
        operation="CREATE" if old is None else "UPDATE",
        old=old,
        new=new,
        user=user,
        subresource=sub,
        dry_run=dry,
    )
    body = json.dumps(doc).encode()
    parsed = parse_review(body)
    assert parsed.uid == doc["request"]["uid"] and parsed.dry_run is dry
    reference = full_change(json.loads(body))
    assert evaluate(parsed.change, CONFIG) == evaluate(reference, CONFIG)


def test_realistic_sizes_parse() -> None:
    for size in (10_000, 20_000, 30_000):
        for resource, obj in (
            ("trainjobs", trainjob(suspend=True, instance="3")),
            ("workloads", workload(active=False, instance="3")),
        ):
            big = inflate(obj, size)
            assert size <= len(json.dumps(big)) < size + 6000
            body = json.dumps(review(resource=resource, old=big, new=big)).encode()
            assert evaluate(parse_review(body).change, CONFIG) is None


def test_generate_name_on_create() -> None:
    body = review(operation="CREATE", new=trainjob(suspend=True), name="")
    body["request"]["object"]["metadata"] = {"generateName": "job-"}
    assert parse_review(json.dumps(body).encode()).change.name == "job-"


def test_response_shapes() -> None:
    assert allow("u") == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": True},
    }
    from holdwarden.vocabulary import RuleId

    denied = deny("u", Violation(RuleId.KUEUE_OWNS_SUSPEND, "m", None), dry_run=False)
    assert denied["response"]["auditAnnotations"] == {"rule": "kueue-owns-suspend"}
    assert denied["response"]["status"] == {
        "status": "Failure",
        "code": 403,
        "reason": "Forbidden",
        "message": "m",
    }


@given(uid=st.text(max_size=40))
def test_pre_encoded_allow_equals_allow(uid: str) -> None:
    assert json.loads(allow_bytes(uid)) == allow(uid)


# --- nesting: the fast path (msgspec) and the slow path (yajl, then msgspec) -------------

DEEP = "__deep__"  # a placeholder string, replaced by nested lists in the JSON text


def nested(levels: int) -> str:
    """JSON text of ``levels`` nested lists (levels >= 1)."""
    return "[" * levels + "]" * levels


def with_deep(doc: dict[str, Any], levels: int) -> bytes:
    """``doc`` as JSON with its one ``DEEP`` string replaced by ``levels`` nested lists."""
    text = json.dumps(doc)
    assert text.count(json.dumps(DEEP)) == 1
    return text.replace(json.dumps(DEEP), nested(levels)).encode()


def held_update() -> dict[str, Any]:
    """A held TrainJob unsuspended by alice: refused by held-trainjob-suspended."""
    doc = review(old=trainjob(suspend=True, instance="3"), new=trainjob(instance="3"))
    doc["request"]["uid"] = "uid-1"
    return doc


def depth_of(body: bytes) -> int:
    """The body's nesting depth (its deepest container's level, the root being 1)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            escaped, in_string = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


REFERENCE = parse_review(json.dumps(held_update()).encode())


# (where the nested lists go, how deep the body is then): the Review must be REFERENCE's,
# by either path. A new object (level 3 of the body) nested APISERVER_MAX_JSON_DEPTH deep
# is the deepest the apiserver sends; 900 levels the fast path decodes on every Python;
# 1,600 only on 3.13; the rest only the slow path.
@pytest.mark.parametrize("body_depth", [12, 900, 1_600, 9_999, MAX_REVIEW_DEPTH])
@pytest.mark.parametrize(
    "where", [("request", "object", "spec"), ("request", "oldObject", "metadata"), ("request",), ()]
)
def test_unread_nesting_up_to_the_apiservers_depth_is_judged(
    where: tuple[str, ...], body_depth: int
) -> None:
    doc = held_update()
    parent = doc
    for key in where:
        parent = parent[key]
    parent["extra"] = DEEP
    body = with_deep(doc, body_depth - len(where) - 1)
    assert depth_of(body) == body_depth
    fast, slow = parse_review(body), parse_review(body, iterative=True)
    assert fast == slow == REFERENCE
    assert evaluate(slow.change, CONFIG) == evaluate(REFERENCE.change, CONFIG) is not None


@pytest.mark.parametrize("body_depth", [MAX_REVIEW_DEPTH + 1, 20_000, 200_000])
@pytest.mark.parametrize("iterative", [False, True])
def test_nesting_deeper_than_the_apiserver_stores_is_a_400(
    body_depth: int, iterative: bool
) -> None:
    doc = held_update()
    doc["request"]["object"]["spec"]["extra"] = DEEP
    body = with_deep(doc, body_depth - 4)
    assert depth_of(body) == body_depth
    with pytest.raises(BadReview) as refused:
        parse_review(body, iterative=iterative)
    assert refused.value.status == 400
    assert refused.value.message == (
        f"body is not valid JSON: the body is nested deeper than {MAX_REVIEW_DEPTH:,} levels"
    )
    assert MAX_REVIEW_DEPTH == APISERVER_MAX_JSON_DEPTH + 2  # the review and its request


def test_a_read_field_is_kept_whole_up_to_the_read_depth() -> None:
    # An annotation's value starts at level 6 (review, request, object, metadata,
    # annotations, the value). No apiserver sends one that is not a string; the rules spell
    # it with its type, so it is kept whole, within MAX_READ_DEPTH.
    doc = held_update()
    doc["request"]["object"]["metadata"]["annotations"]["other"] = DEEP
    body = with_deep(doc, MAX_READ_DEPTH - 5)
    assert depth_of(body) == MAX_READ_DEPTH
    fast, slow = parse_review(body), parse_review(body, iterative=True)
    assert fast == slow
    assert slow.change.new is not None
    assert slow.change.new["metadata"]["annotations"]["other"] == json.loads(nested(95))
    deeper = with_deep(doc, MAX_READ_DEPTH - 4)
    assert parse_review(deeper).change.new is not None  # msgspec decodes it
    with pytest.raises(BadReview) as refused:  # the slow path keeps no deeper read value
        parse_review(deeper, iterative=True)
    assert refused.value.message == (
        "body is not valid JSON: a field the enforcer reads is nested deeper than 100 levels"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"request": [1, {"a": 2}]}', "Expected `object | null`, got `array` - at `$.request`"),
        (b"[]", "Expected `object`, got `array`"),
        (
            b'{"request": {"resource": {"group": [[1]]}}}',
            "Expected `str`, got `array` - at `$.request.resource.group`",
        ),
        (b'{"request": {"dryRun": 1e400}}', "Number out of range - at `$.request.dryRun`"),
        (b'{"request": {"uid": "u", "object": {"spec": {"suspend": 1e400}}}}', "Number out"),
    ],
)
def test_both_paths_refuse_a_wrong_type_alike(body: bytes, message: str) -> None:
    answers = []
    for iterative in (False, True):
        with pytest.raises(BadReview) as refused:
            parse_review(body, iterative=iterative)
        answers.append((refused.value.status, refused.value.message))
    assert answers[0] == answers[1]
    assert answers[0][0] == 400 and message in answers[0][1]


@pytest.mark.parametrize(
    "body",
    [b'{"a":1,}', b'{"a": [1 2]}', b"{} x", b"", b"NaN", b'{"a": 01}', b'{"a":"\\x"}', b"\xff"],
)
def test_the_slow_path_refuses_what_is_not_json(body: bytes) -> None:
    for iterative in (False, True):
        with pytest.raises(BadReview) as refused:
            parse_review(body, iterative=iterative)
        assert refused.value.status == 400
        assert refused.value.message.startswith("body is not valid JSON: ")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
# Where a random value goes: fields no view reads, fields decoded whole (Any or typed), and
# views themselves (a wrong type there is a 400 naming the same path).
PLACES = [
    ("request", "options"),
    ("request", "object", "spec", "template"),
    ("extra",),
    ("request", "object", "metadata", "annotations", "other"),
    ("request", "object", "metadata", "ownerReferences"),
    ("request", "oldObject", "spec", "suspend"),
    ("request", "resource", "group"),
    ("request", "userInfo", "groups"),
    ("request", "dryRun"),
    ("request", "uid"),
    ("request", "userInfo"),
    ("request", "object", "metadata"),
    ("request", "object"),
]


def outcome(body: bytes, *, iterative: bool) -> Review | tuple[int, str]:
    try:
        return parse_review(body, iterative=iterative)
    except BadReview as bad:
        return bad.status, bad.message


@settings(max_examples=300, deadline=None)
@given(
    old=st.one_of(st.none(), objects()),
    new=objects(),
    placed=st.lists(st.tuples(st.sampled_from(PLACES), json_values), max_size=3),
    indent=st.sampled_from([None, 0, 2]),
)
def test_the_slow_path_gives_the_fast_paths_review(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    placed: list[tuple[tuple[str, ...], Any]],
    indent: int | None,
) -> None:
    doc = review(operation="CREATE" if old is None else "UPDATE", old=old, new=new)
    for path, value in placed:
        parent = doc
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                break
            parent = parent[key]
        else:
            parent[path[-1]] = value
    body = json.dumps(doc, indent=indent).encode()
    assert outcome(body, iterative=True) == outcome(body, iterative=False)


@pytest.mark.parametrize("number", ["3.5907868606406692e+16", "1e3", "1.0", "10", "-2E-3"])
def test_the_slow_path_keeps_a_numbers_kind(number: str) -> None:
    # yajl normalises 3.59e+16 to Decimal('35907868606406692'); re-written bare it would be
    # an int, and a typed field's 400 would name the wrong type (found by the property
    # above, on Python 3.12).
    body = json.dumps(review(operation="CREATE", new=trainjob(suspend=True))).encode()
    body = body.replace(b'"dryRun": false', b'"dryRun": ' + number.encode())
    assert b'"dryRun": ' + number.encode() in body
    assert outcome(body, iterative=True) == outcome(body, iterative=False)
