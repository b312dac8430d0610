"""holdwarden.objects: the one set of TrainJob/Workload accessors (pure, total)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holdwarden import objects
from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, Annotations

A = Annotations("holdwarden.io")


def meta(**fields: Any) -> dict[str, Any]:
    return {"metadata": fields}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(None, None, id="none"),
        pytest.param("junk", None, id="not-a-map"),
        pytest.param(meta(), None, id="no-annotations"),
        pytest.param(meta(annotations=[1]), None, id="annotations-not-a-map"),
        pytest.param(meta(annotations={A.hold_instance: "3"}), "3", id="text"),
        pytest.param(meta(annotations={A.hold_instance: 3}), "3 (int)", id="int-spelled"),
        pytest.param(meta(annotations={A.hold_instance: ""}), "", id="empty-is-present"),
    ],
)
def test_hold_instance_text(obj: Any, expected: str | None) -> None:
    assert objects.hold_instance_text(obj, A) == expected
    assert objects.hold_instance_text(obj, A.hold_instance) == expected


@pytest.mark.parametrize(
    ("spec", "suspended", "active"),
    [
        pytest.param({}, False, True, id="absent"),
        pytest.param({"suspend": True, "active": False}, True, False, id="literal"),
        pytest.param({"suspend": "true", "active": "false"}, False, True, id="strings"),
        pytest.param({"suspend": 1, "active": 0}, False, True, id="numbers"),
        pytest.param({"suspend": None, "active": None}, False, True, id="null"),
    ],
)
def test_suspended_and_active(spec: dict[str, Any], suspended: bool, active: bool) -> None:
    assert objects.suspended({"spec": spec}) is suspended
    assert objects.active({"spec": spec}) is active
    assert objects.hold_field_set({"spec": spec}, "plain") is suspended
    assert objects.hold_field_set({"spec": spec}, "kueue") is (not active)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, 0, id="absent"),
        pytest.param("0", 0, id="zero"),
        pytest.param("7", 7, id="seven"),
        pytest.param("07", None, id="leading-zero"),
        pytest.param("-1", None, id="negative"),
        pytest.param(" 7", None, id="space"),
        pytest.param("1e3", None, id="exponent"),
        pytest.param("", None, id="empty"),
    ],
)
def test_attempt(value: str | None, expected: int | None) -> None:
    tj = meta(annotations={} if value is None else {A.attempt: value})
    assert objects.attempt(tj, A) == expected
    assert objects.parse_attempt(value) == expected


@pytest.mark.parametrize(
    ("conds", "expected"),
    [
        pytest.param([], None, id="none"),
        pytest.param([{"type": "Complete", "status": "True"}], "Complete", id="complete"),
        pytest.param([{"type": "Failed", "status": "True"}], "Failed", id="failed"),
        pytest.param([{"type": "Complete", "status": "False"}], None, id="false"),
        pytest.param(["junk", {"type": "Failed", "status": "True"}], "Failed", id="junk-skipped"),
        pytest.param("junk", None, id="not-a-list"),
        pytest.param(
            [{"type": "Complete", "status": "False"}, {"type": "Complete", "status": "True"}],
            "Complete",
            id="duplicate-type-any-true-ends-it",  # Hypothesis found it: Release ran it
        ),
    ],
)
def test_ended_reason(conds: Any, expected: str | None) -> None:
    assert objects.ended_reason({"status": {"conditions": conds}}) == expected


def _owner(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": TRAINJOB.api_version, "kind": TRAINJOB.kind, **fields}


@pytest.mark.parametrize(
    ("refs", "expected"),
    [
        pytest.param([], None, id="none"),
        pytest.param([_owner(name="a", uid="u", controller=True)], ("a", "u"), id="controller"),
        pytest.param([_owner(name="a", uid="u")], None, id="not-controller"),
        pytest.param([{"kind": "JobSet", "name": "a", "controller": True}], None, id="other-kind"),
        pytest.param(
            [_owner(name="x", uid="1"), _owner(name="a", uid="u", controller=True)],
            ("a", "u"),
            id="controller-among-owners",
        ),
        pytest.param("junk", None, id="not-a-list"),
    ],
)
def test_controller_trainjob(refs: Any, expected: tuple[str, str] | None) -> None:
    wl = meta(ownerReferences=refs)
    owner = objects.controller_trainjob(wl)
    assert (None if owner is None else (owner.name, owner.uid)) == expected
    if expected is not None:
        assert objects.controlled_by(wl, expected[1])
        assert not objects.controlled_by(wl, "other")


def test_kueue_managed_and_deleting() -> None:
    assert objects.is_kueue_managed(meta(labels={QUEUE_NAME_LABEL: "q"}))
    assert not objects.is_kueue_managed(meta(labels={"other": "q"}))
    assert objects.is_deleting(meta(deletionTimestamp="2026-01-01T00:00:00Z"))
    assert not objects.is_deleting(meta())


def test_format_time() -> None:
    moment = datetime(2026, 1, 1, 14, 30, 5, 999, tzinfo=timezone(timedelta(hours=2)))
    assert objects.format_time(moment) == "2026-01-01T12:30:05Z"
    assert objects.format_time(moment.astimezone(UTC)) == "2026-01-01T12:30:05Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        objects.format_time(datetime(2026, 1, 1))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(
        st.sampled_from(
            ["metadata", "spec", "status", "annotations", "labels", "ownerReferences",
             "conditions", "suspend", "active", A.hold_instance, A.attempt, A.opened, "kind",
             "controller", "name", "uid", "type", "deletionTimestamp"]
        ),
        inner,
        max_size=4,
    ),
    max_leaves=12,
)  # fmt: skip


@given(obj=_json)
@settings(max_examples=500, deadline=None)
def test_every_accessor_is_total(obj: Any) -> None:
    """The enforcer reads whatever a client sent: no accessor ever raises."""
    objects.hold_instance_text(obj, A)
    objects.hold_instance(obj, A)
    objects.annotations_of(obj)
    objects.attempt(obj, A)
    objects.opened_at(obj, A)
    assert isinstance(objects.suspended(obj), bool)
    assert isinstance(objects.active(obj), bool)
    objects.ended_reason(obj)
    objects.controller_trainjob(obj)
    objects.is_kueue_managed(obj)
    objects.is_deleting(obj)
    instance = objects.hold_instance(obj, A)
    assert instance is None or str(instance) == objects.hold_instance_text(obj, A)
