"""Minimal writes (adapter/patches.py): the merge patch from the object as read to the object
as decided, and which preconditioned patch the REAL apiserver answers with 409."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from holdwarden.adapter import decisions
from holdwarden.adapter.patches import apply_merge_patch, operations, write_patch
from holdwarden.vocabulary import TRAINJOB, Annotations
from rig.builders import trainjob_body

A = Annotations()
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

_scalars = st.one_of(st.booleans(), st.integers(-5, 5), st.text("abc", max_size=3))
_json: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text("xyz/~", max_size=3), inner, max_size=3),
    ),
    max_leaves=12,
)
_objects = st.dictionaries(
    st.sampled_from(["spec", "status", "data", "a/b", "~0"]), _json, max_size=4
)


@settings(max_examples=400, deadline=None)
@given(_objects, _objects)
def test_the_merge_patch_turns_the_read_into_the_decided(
    read_rest: dict[str, Any], decided_rest: dict[str, Any]
) -> None:
    read = {"metadata": {"resourceVersion": "7", "annotations": {"k": "v"}}, **read_rest}
    decided = {"metadata": {"resourceVersion": "7"}, **decided_rest}
    frozen = copy.deepcopy(read)
    patch = write_patch(read, decided)
    assert read == frozen  # the read is never modified
    assert patch["metadata"]["resourceVersion"] == "7"
    assert apply_merge_patch(read, patch) == decided


def _share_some(read: Any, decided: Any, picks: list[bool]) -> Any:
    """``decided`` with some of its mapping entries replaced by ``read``'s very objects
    (as decisions share status and managedFields), at every depth, drawn by ``picks``."""
    if not (isinstance(read, dict) and isinstance(decided, dict)):
        return decided
    out: dict[str, Any] = {}
    for key, value in decided.items():
        take = picks.pop() if picks else False
        if key in read and take:
            out[key] = read[key]
        else:
            out[key] = _share_some(read.get(key), value, picks)
    return out


@settings(max_examples=400, deadline=None)
@given(_objects, _objects, st.lists(st.booleans(), max_size=30))
def test_the_operations_are_the_same_whatever_the_decided_shares_with_the_read(
    read_rest: dict[str, Any], decided_rest: dict[str, Any], picks: list[bool]
) -> None:
    """Leaving shared sub-trees out before jsonpatch walks them changes no operation."""
    read = {"metadata": {"resourceVersion": "7"}, **read_rest}
    decided = _share_some(read, {"metadata": {"resourceVersion": "7"}, **decided_rest}, picks)
    frozen_read, frozen_decided = copy.deepcopy(read), copy.deepcopy(decided)
    ops = operations(read, decided)
    assert read == frozen_read and decided == frozen_decided
    assert jsonpatch.apply_patch(frozen_read, ops) == frozen_decided
    # The write is exactly the one made from unshared copies (jsonpatch may pick another
    # of two equal values as a move's source; the merge patch writes both places alike).
    assert write_patch(read, decided) == write_patch(frozen_read, frozen_decided)
    assert apply_merge_patch(read, write_patch(read, decided)) == decided


def _trainjob() -> dict[str, Any]:
    body = trainjob_body("job", suspend=False)
    body["metadata"].update(
        namespace="ns",
        resourceVersion="41",
        uid="u-1",
        annotations={A.opened: "2026-12-02T11:00:00Z", A.attempt: "1", "other": "x"},
        managedFields=[{"manager": "m", "fieldsV1": {"f:spec": {}}}] * 20,
    )
    body["status"] = {"conditions": [{"type": "Created", "status": "True"}] * 10}
    return body


def test_a_hold_is_a_few_hundred_bytes_not_the_whole_object() -> None:
    read = _trainjob()
    decided = decisions.decide_hold(
        read, mode="plain", instance=3, reason="node lost", holder="d", now=NOW, annotations=A
    ).body
    assert decided is not None
    patch = write_patch(read, decided)
    assert patch == {
        "metadata": {
            "resourceVersion": "41",
            "annotations": {
                A.hold_instance: "3",
                A.hold_reason: "node lost",
                A.held_at: "2026-12-02T12:00:00Z",
                A.held_by: "d",
            },
        },
        "spec": {"suspend": True},
    }
    assert len(json.dumps(patch)) * 5 < len(json.dumps(decided))
    released = decisions.decide_release(
        decided, mode="plain", instance=3, annotations=A, pods_remain=False
    ).body
    assert released is not None
    patch = write_patch(decided, released)
    assert patch["metadata"]["annotations"] == {
        A.hold_instance: None,
        A.hold_reason: None,
        A.held_at: None,
        A.held_by: None,
        A.attempt: "2",
    }
    assert patch["spec"] == {"suspend": False}
    # jsonpatch's own view of it: a rename can come out as a "move"; the merge patch has both.
    assert {op["op"] for op in operations(decided, released)} <= {"remove", "replace", "move"}


def test_a_write_without_the_reads_version_is_refused() -> None:
    read = _trainjob()
    with pytest.raises(ValueError, match="resourceVersion"):
        write_patch({**read, "metadata": {}}, read)
    moved = copy.deepcopy(read)
    moved["metadata"]["resourceVersion"] = "42"
    with pytest.raises(ValueError, match="keep the read's resourceVersion"):
        write_patch(read, moved)
    nulled = copy.deepcopy(read)
    nulled["spec"]["x"] = None
    with pytest.raises(ValueError, match="null"):
        write_patch(read, nulled)


# ---- against the real kube-apiserver: which preconditioned patch is a 409? -------------


def _patch(api: k8s.ApiClient, path: str, content_type: str, body: Any) -> tuple[int, str]:
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    request = api.param_serialize("PATCH", path, header_params=headers, body=body)
    response = api.call_api(*request)
    data = json.loads(response.read())  # type: ignore[no-untyped-call]
    return int(response.status), str(data.get("reason") or "")


@pytest.mark.controlplane
def test_the_apiserver_answers_a_stale_merge_patch_409_and_a_failed_json_patch_test_422(
    admin_client: k8s.ApiClient, namespace: str
) -> None:
    custom = k8s.CustomObjectsApi(admin_client)
    args = (TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural)
    created: Any = custom.create_namespaced_custom_object(*args, trainjob_body("job"))
    stale = created["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(*args, "job", {"metadata": {"labels": {"moved": "1"}}})
    path = f"/apis/{TRAINJOB.group}/{TRAINJOB.version}/namespaces/{namespace}/trainjobs/job"
    merge = {"metadata": {"resourceVersion": stale, "annotations": {"a": "b"}}}
    assert _patch(admin_client, path, "application/merge-patch+json", merge) == (409, "Conflict")
    test_first = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
        {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},
    ]
    assert _patch(admin_client, path, "application/json-patch+json", test_first) == (
        422,
        "Invalid",
    )
    current: Any = custom.get_namespaced_custom_object(*args, "job")
    merge["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    assert _patch(admin_client, path, "application/merge-patch+json", merge)[0] == 200
