"""One hold-instance bound, 1 <= n <= 2^63-1, in every part (design.md; issue 11 item 4).

Before the bound, ``Hold(instance=10**19)`` wrote "10000000000000000000", which its own
parser then called malformed, so the matching Release was StaleHold; and 9999999999999999999
(above int64) was accepted because the parser only capped the length at 19 digits.

Pure tests here; the end-to-end ones (nothing sent for 2^63, 2^63-1 held and released
against the real API server) are in ``tests/controlplane/test_adapter_supervisor.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from holdwarden import objects
from holdwarden.adapter import decisions
from holdwarden.adapter.cli import _instance
from holdwarden.adapter.decisions import Outcome
from holdwarden.config import Config
from holdwarden.readmission.decisions import granted_attempt, why_waiting
from holdwarden.vocabulary import (
    MAX_HOLD_INSTANCE,
    Annotations,
    RuleId,
    check_hold_instance,
    format_hold_instance,
    parse_hold_instance,
)
from holdwarden.webhook.rules import Change, RulesConfig, evaluate

A = Annotations()
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TOO_BIG = [2**63, 10**19, 9_999_999_999_999_999_999, 10**30]


def test_the_bound_is_int64() -> None:
    assert MAX_HOLD_INSTANCE == 9_223_372_036_854_775_807 == 2**63 - 1


@pytest.mark.parametrize("value", [*TOO_BIG, 0, -1, True, 1.0, "1", None])
def test_check_refuses_outside_the_bound(value: Any) -> None:
    with pytest.raises(ValueError, match=r">= 1 and <= 2\^63-1"):
        check_hold_instance(value)
    with pytest.raises(ValueError):
        format_hold_instance(value)


@pytest.mark.parametrize("value", [1, 2, MAX_HOLD_INSTANCE])
def test_check_and_parse_agree_inside_the_bound(value: int) -> None:
    assert check_hold_instance(value) == value
    assert parse_hold_instance(format_hold_instance(value)) == value


@pytest.mark.parametrize("value", TOO_BIG)
def test_parse_refuses_above_the_bound(value: int) -> None:
    assert parse_hold_instance(str(value)) is None


@pytest.mark.parametrize("value", TOO_BIG)
def test_decisions_refuse_above_the_bound(value: int) -> None:
    obj: dict[str, Any] = {"metadata": {"resourceVersion": "1"}, "spec": {}}
    hold = decisions.decide_hold(
        obj, mode="plain", instance=value, reason="r", holder="h", now=NOW, annotations=A
    )
    release = decisions.decide_release(obj, mode="plain", instance=value, annotations=A)
    assert hold.outcome is Outcome.INVALID and release.outcome is Outcome.INVALID


def test_hold_of_the_largest_instance_is_released_by_the_same_instance() -> None:
    obj: dict[str, Any] = {"metadata": {"resourceVersion": "1"}, "spec": {}}
    hold = decisions.decide_hold(
        obj, mode="plain", instance=MAX_HOLD_INSTANCE, reason="r", holder="h", now=NOW,
        annotations=A,
    )  # fmt: skip
    assert hold.body is not None
    assert objects.hold_instance(hold.body, A) == MAX_HOLD_INSTANCE
    release = decisions.decide_release(
        hold.body, mode="plain", instance=MAX_HOLD_INSTANCE, annotations=A
    )
    assert release.outcome is Outcome.WRITE


def _create(instance: str) -> Change:
    new = {
        "metadata": {"name": "job", "namespace": "ns", "annotations": {A.hold_instance: instance}},
        "spec": {"suspend": True},
    }
    return Change(
        group="trainer.kubeflow.org",
        resource="trainjobs",
        subresource="",
        operation="CREATE",
        namespace="ns",
        name="job",
        username="alice",
        groups=("system:authenticated",),
        old=None,
        new=new,
    )


@pytest.mark.parametrize("value", [str(v) for v in TOO_BIG])
def test_the_enforcer_refuses_above_the_bound(value: str) -> None:
    got = evaluate(_create(value), RulesConfig.from_config(Config()))
    assert got is not None and got.rule is RuleId.HOLD_INSTANCE_MALFORMED
    assert str(MAX_HOLD_INSTANCE) in got.message


def test_the_enforcer_accepts_the_largest_instance() -> None:
    assert evaluate(_create(str(MAX_HOLD_INSTANCE)), RulesConfig.from_config(Config())) is None


def test_the_gate_waits_for_any_hold_and_reads_attempts_within_the_bound() -> None:
    workload = {"metadata": {"annotations": {A.hold_instance: str(2**63)}}, "spec": {}}
    trainjob = {"metadata": {"annotations": {A.opened: "2026-12-02T11:00:00Z"}}}
    # A hold annotation out of range is still a hold: the gate never admits past it.
    assert why_waiting(workload, trainjob, 0, A) == f"hold instance {2**63} is in force"
    assert granted_attempt(f"holdwarden: attempt {MAX_HOLD_INSTANCE} admitted") == (
        MAX_HOLD_INSTANCE
    )
    assert granted_attempt(f"holdwarden: attempt {2**63} admitted") is None


@pytest.mark.parametrize("text", [str(2**63), "10000000000000000000", "0", "x"])
def test_the_cli_refuses_outside_the_bound(text: str) -> None:
    with pytest.raises(Exception, match=r"integer in \[1, 9223372036854775807\]"):
        _instance(text)
    assert _instance(str(MAX_HOLD_INSTANCE)) == MAX_HOLD_INSTANCE
