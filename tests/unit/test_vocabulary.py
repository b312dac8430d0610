"""The shared vocabulary: annotation keys and the canonical spelling of a hold instance."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.vocabulary import (
    Annotations,
    RuleId,
    format_hold_instance,
    parse_hold_instance,
)


def test_annotation_keys_follow_the_prefix() -> None:
    notes = Annotations("holds.example.com")
    assert notes.hold_keys == (
        "holds.example.com/hold-instance",
        "holds.example.com/hold-reason",
        "holds.example.com/held-at",
        "holds.example.com/held-by",
    )
    assert notes.opened == "holds.example.com/opened"
    assert notes.attempt == "holds.example.com/attempt"
    assert Annotations().hold_instance == "holdwarden.io/hold-instance"


def test_rule_ids_are_the_published_ones() -> None:
    assert {rule.value for rule in RuleId} == {
        "held-trainjob-suspended",
        "held-workload-inactive",
        "kueue-owns-suspend",
        "hold-instance-monotonic",
        "hold-instance-malformed",
        "hold-owner-only",
        "held-workload-kept",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", 1),
        ("42", 42),
        ("9223372036854775807", 9223372036854775807),
        ("0", None),
        ("01", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1 ", None),
        ("1.0", None),
        ("", None),
        ("\u0661", None),  # ARABIC-INDIC DIGIT ONE: not decimal here
        ("99999999999999999999", None),  # past 19 digits
        (1, None),
        (None, None),
    ],
)
def test_parse_hold_instance(value: object, expected: int | None) -> None:
    assert parse_hold_instance(value) == expected


@given(st.integers(min_value=1, max_value=10**18))
def test_instances_round_trip(instance: int) -> None:
    assert parse_hold_instance(format_hold_instance(instance)) == instance


@given(st.text(max_size=25))
def test_parse_accepts_only_canonical_spellings(text: str) -> None:
    parsed = parse_hold_instance(text)
    if parsed is not None:
        assert parsed >= 1
        assert str(parsed) == text


@pytest.mark.parametrize("bad", [0, -3, True, 1.0, "1"])
def test_format_refuses_non_instances(bad: object) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        format_hold_instance(bad)  # type: ignore[arg-type]
