"""The fast typed parser sees exactly what a full JSON parse sees, as far as the rules go."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden.config import Config
from holdwarden.vocabulary import QUEUE_NAME_LABEL, Annotations
from tests.review_samples import inflate, review, trainjob, workload
from webhook.review import allow, allow_bytes, deny, parse_review
from webhook.rules import Change, RulesConfig, Violation, evaluate

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
