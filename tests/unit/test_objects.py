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
             "controller", "name", "uid", "type", "deletionTimestamp", "admissionChecks",
             "generation", "namespace", "resourceVersion", "state", A.hold_reason]
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
    assert objects.hold_marks(obj, A).instance == instance
    for read in (objects.uid, objects.namespace, objects.resource_version):
        assert read(obj) is None or isinstance(read(obj), str)
    assert objects.generation(obj) is None or type(objects.generation(obj)) is int
    assert objects.same_identity(obj, obj)
    objects.admission_check_names(obj)
    objects.admission_check(obj, ["gate"])
    objects.admission_check_states(obj)
    objects.cluster_queue_admission_checks(obj)
    nxt = objects.next_attempt(obj, A)
    assert nxt is None or nxt == (objects.attempt(obj, A) or 0) + 1


# ---- identity ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "uid", "generation"),
    [
        pytest.param({}, None, None, id="absent"),
        pytest.param({"uid": "u1", "generation": 3}, "u1", 3, id="present"),
        pytest.param({"uid": 7, "generation": "3"}, None, None, id="wrong-types"),
        pytest.param({"uid": "", "generation": True}, "", None, id="empty-uid-bool-generation"),
        pytest.param({"generation": 0}, None, 0, id="generation-zero"),
    ],
)
def test_uid_and_generation(metadata: dict[str, Any], uid: str | None, generation: Any) -> None:
    obj = {"metadata": metadata}
    assert objects.uid(obj) == uid
    assert objects.generation(obj) == generation


_REFS = [_owner(name="a", uid="u", controller=True)]


@pytest.mark.parametrize(
    ("was", "now", "same"),
    [
        pytest.param(meta(uid="u1"), meta(uid="u1", resourceVersion="9"), True, id="moved-on"),
        pytest.param(meta(uid="u1"), meta(uid="u2"), False, id="replaced"),
        pytest.param(
            meta(uid="u1", ownerReferences=_REFS), meta(uid="u1"), False, id="owner-dropped"
        ),
        pytest.param(
            meta(uid="u1", ownerReferences=_REFS),
            meta(uid="u1", ownerReferences=list(_REFS)),
            True,
            id="same-owners",
        ),
        pytest.param({}, {"metadata": None}, True, id="neither-has-identity"),
    ],
)
def test_same_identity(was: Any, now: Any, same: bool) -> None:
    assert objects.same_identity(was, now) is same
    assert objects.same_identity(now, was) is same


def test_job_uid_selector() -> None:
    assert objects.job_uid_selector("u-1") == "kueue.x-k8s.io/job-uid=u-1"


# Vectors printed by Kueue v0.19.2's own jobframework.GetWorkloadNameForOwnerWithGVK for
# the TrainJob GVK: (name, uid, default name, name with its ShortWorkloadNames gate on).
KUEUE_V0_19_2_NAMES = [
    ("job", "3f0b1c6e-2a7d-4e59-9a51-0c8f2d6b7e41", "trainjob-job-8f725", "trainjob-job-8f725"),
    (
        "llama-70b-finetune",
        "00000000-0000-0000-0000-000000000001",
        "trainjob-llama-70b-finetune-709ff",
        "trainjob-llama-70b-finetune-709ff",
    ),
    (
        "a" * 60,
        "5c1e2b9a-7f3d-4c8e-b1a2-9d0e3f4a5b6c",
        "trainjob-" + "a" * 60 + "-2edf7",
        "trainjob-" + "a" * 48 + "-2edf7",
    ),
    (
        "b" * 250,
        "5c1e2b9a-7f3d-4c8e-b1a2-9d0e3f4a5b6c",
        "trainjob-" + "b" * 238 + "-5369a",
        "trainjob-" + "b" * 48 + "-5369a",
    ),
]


@pytest.mark.parametrize(("name", "uid", "default", "short"), KUEUE_V0_19_2_NAMES)
def test_kueue_workload_names_match_kueues(name: str, uid: str, default: str, short: str) -> None:
    names = objects.kueue_workload_names(name, uid)
    assert names[0] == default, "the default spelling comes first"
    assert short in names
    assert len(names) == len(set(names)) == (1 if default == short else 2)


@given(
    name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=253),
    uid=st.uuids().map(str),
)
def test_property_kueue_workload_names_fit_both_limits(name: str, uid: str) -> None:
    names = objects.kueue_workload_names(name, uid)
    assert names[0].startswith("trainjob-") and len(names[0]) <= 253
    assert all(len(n) <= 253 for n in names) and min(len(n) for n in names) <= 63
    # One name when the prefix fits both limits; both spellings share the hash.
    assert (len(names) == 1) == (len("trainjob-" + name) <= 63 - 6)
    assert len({n[-6:] for n in names}) == 1


# ---- status.admissionChecks ----------------------------------------------------------------


def _checks(entries: Any) -> dict[str, Any]:
    return {"status": {"admissionChecks": entries}}


@pytest.mark.parametrize(
    ("entries", "names", "states", "gate"),
    [
        pytest.param(None, [], (), None, id="absent"),
        pytest.param("junk", [], (), None, id="not-a-list"),
        pytest.param(
            [{"name": "gate", "state": "Pending"}, {"name": "mk", "state": "Ready"}],
            ["gate", "mk"],
            (("gate", "Pending"), ("mk", "Ready")),
            0,
            id="two",
        ),
        pytest.param(
            ["junk", {"name": "z", "state": "Ready"}, {"name": "gate"}],
            ["z", "gate"],
            (("gate", "None (NoneType)"), ("z", "Ready")),
            2,
            id="junk-keeps-the-index",
        ),
        pytest.param(
            [{"name": 3, "state": "Ready"}, {"name": "", "state": "Ready"}],
            [""],
            (),
            None,
            id="names-not-text-or-empty",
        ),
    ],
)
def test_admission_checks(
    entries: Any, names: list[str], states: tuple[tuple[str, str], ...], gate: int | None
) -> None:
    """One reading of status.admissionChecks for the adapter's Observe, the gate's index and
    the gate's decision; the index is the entry's place in the list as written."""
    wl = _checks(entries)
    assert objects.admission_check_names(wl) == names
    assert objects.admission_check_states(wl) == states
    found = objects.admission_check(wl, {"gate"})
    assert (None if found is None else found[0]) == gate
    if found is not None:
        assert entries[found[0]] is found[1]


def test_with_admission_check_writes_a_copy() -> None:
    wl = _checks(["junk", {"name": "gate", "state": "Pending", "message": "m"}])
    updated = objects.with_admission_check(wl, 1, {"state": "Ready", "message": "ok"})
    assert updated["status"]["admissionChecks"][1] == {
        "name": "gate",
        "state": "Ready",
        "message": "ok",
    }
    assert wl == _checks(["junk", {"name": "gate", "state": "Pending", "message": "m"}])


# ---- writes --------------------------------------------------------------------------------

AT = datetime(2026, 12, 3, 12, 0, 5, tzinfo=UTC)


def test_hold_annotations_round_trip_through_the_readers() -> None:
    marks = objects.hold_annotations(A, instance=7, reason="node lost", holder="dispatch", at=AT)
    assert marks == {
        A.hold_instance: "7",
        A.hold_reason: "node lost",
        A.held_at: "2026-12-03T12:00:05Z",
        A.held_by: "dispatch",
    }
    assert set(marks) == set(A.hold_keys)
    read = objects.hold_marks(meta(annotations=marks), A)
    assert (read.instance, read.reason, read.by, read.at) == (
        7,
        "node lost",
        "dispatch",
        "2026-12-03T12:00:05Z",
    )
    with pytest.raises(ValueError):
        objects.hold_annotations(A, instance=0, reason="r", holder="h", at=AT)


def test_opened_and_attempt_annotations() -> None:
    assert objects.opened_annotation(A, AT) == {A.opened: "2026-12-03T12:00:05Z"}
    assert objects.attempt_annotation(A, 0) == {A.attempt: "0"}
    assert objects.attempt_annotation(A, 12) == {A.attempt: "12"}
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError):
            objects.attempt_annotation(A, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, 1, id="absent-is-zero"),
        pytest.param("0", 1, id="zero"),
        pytest.param("41", 42, id="forty-one"),
        pytest.param("x", None, id="garbled"),
        pytest.param(3, None, id="not-text"),
    ],
)
def test_next_attempt(value: Any, expected: int | None) -> None:
    tj = meta(annotations={} if value is None else {A.attempt: value})
    assert objects.next_attempt(tj, A) == expected


@pytest.mark.parametrize(
    ("obj", "put", "remove", "annotations"),
    [
        pytest.param(meta(), {"a": "1"}, (), {"a": "1"}, id="no-annotations"),
        pytest.param(meta(annotations=None), None, ("a",), {}, id="null-annotations"),
        pytest.param(
            meta(annotations={"a": "1", "b": "2"}), {"c": "3"}, ("a",), {"b": "2", "c": "3"},
            id="remove-then-put",
        ),
        pytest.param(
            meta(annotations={"a": "1"}), {"a": "2"}, ("a",), {"a": "2"}, id="put-wins",
        ),
    ],
)  # fmt: skip
def test_annotated(
    obj: dict[str, Any], put: dict[str, str] | None, remove: tuple[str, ...], annotations: Any
) -> None:
    assert objects.annotated(obj, put, remove)["metadata"]["annotations"] == annotations


@given(
    ann=st.dictionaries(st.sampled_from(["a", "b", A.attempt, *A.hold_keys]), st.text(max_size=3)),
    put=st.dictionaries(st.sampled_from(["a", A.opened, A.attempt]), st.text(max_size=3)),
    remove=st.lists(st.sampled_from(["b", *A.hold_keys])),
)
def test_property_annotated_copies_what_it_changes_and_shares_the_rest(
    ann: dict[str, str], put: dict[str, str], remove: list[str]
) -> None:
    status: dict[str, Any] = {"conditions": []}
    obj = {"metadata": {"name": "j", "annotations": dict(ann)}, "spec": {"x": 1}, "status": status}
    body = objects.annotated(obj, put, remove)
    assert obj == {
        "metadata": {"name": "j", "annotations": ann},
        "spec": {"x": 1},
        "status": status,
    }
    assert body["status"] is status  # shared: never copied between a read and its write
    assert body["spec"] == {"x": 1} and body["spec"] is not obj["spec"]
    expected = {k: v for k, v in ann.items() if k not in remove} | put
    assert body["metadata"]["annotations"] == expected
