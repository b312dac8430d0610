"""Table tests and properties of holdwarden/labelselector.py (Kueue's
managedJobsNamespaceSelector as holdwarden reads it) and of the configuration keys that
carry it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdwarden import labelselector
from holdwarden.config import Config, ConfigError
from holdwarden.labelselector import LabelSelector, Requirement, SelectorError

NS = labelselector.NAMESPACE_NAME_LABEL


@pytest.mark.parametrize(
    ("selector", "labels", "matched"),
    [
        ({}, {}, True),
        ({}, {"a": "b"}, True),
        ({"matchLabels": {"team": "ml"}}, {"team": "ml"}, True),
        ({"matchLabels": {"team": "ml"}}, {"team": "web"}, False),
        ({"matchLabels": {"team": "ml"}}, {}, False),
        (
            {"matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]},
            {"t": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]},
            {"t": "a"},
            False,
        ),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"t": ""}, True),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {"t": "x"}, False),
        # Pairs and requirements are ANDed.
        (
            {
                "matchLabels": {"team": "ml"},
                "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}],
            },
            {"team": "ml", "env": "prod"},
            False,
        ),
    ],
)
def test_matches_as_the_apiserver_does(
    selector: dict[str, Any], labels: dict[str, str], matched: bool
) -> None:
    assert labelselector.parse(selector, "s").matches(labels) is matched


def test_kueues_default_selects_every_namespace_but_kube_system_and_kueues() -> None:
    default = labelselector.kueue_default()
    assert not default.matches({NS: "kube-system"})
    assert not default.matches({NS: "kueue-system"})
    assert default.matches({NS: "team-a"})
    assert default.to_dict() == {
        "matchExpressions": [
            {"key": NS, "operator": "NotIn", "values": ["kube-system", "kueue-system"]}
        ]
    }


@pytest.mark.parametrize(
    ("selector", "path", "problem"),
    [
        ("team=ml", "s", "must be a label selector"),
        ({"matchLabel": {"a": "b"}}, "s.matchLabel", "unknown key"),
        ({"matchLabels": ["a"]}, "s.matchLabels", "mapping"),
        ({"matchLabels": {"a": 1}}, "s.matchLabels", "string value"),
        ({"matchExpressions": {"key": "a"}}, "s.matchExpressions", "list"),
        (
            {"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]},
            "s.matchExpressions[0].operator",
            "'in' is not one of",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In"}]},
            "s.matchExpressions[0].values",
            "at least one value",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "s.matchExpressions[0].values",
            "takes no values",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, "s.matchExpressions[0].key", "label key"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "value": "x"}]},
            "s.matchExpressions[0].value",
            "unknown key",
        ),
    ],
)
def test_a_malformed_selector_is_refused_naming_the_part(
    selector: Any, path: str, problem: str
) -> None:
    with pytest.raises(SelectorError) as raised:
        labelselector.parse(selector, "s")
    assert raised.value.path == path
    assert problem in raised.value.problem


def test_the_configuration_keys_default_as_kueue_and_are_read() -> None:
    default = Config.from_dict({})
    assert default.kueue_manage_jobs_without_queue_name is False
    assert default.kueue_managed_jobs_namespace_selector == labelselector.kueue_default()
    config = Config.from_dict(
        {
            "kueue": {
                "manageJobsWithoutQueueName": True,
                "managedJobsNamespaceSelector": {"matchLabels": {"team": "ml"}},
            }
        }
    )
    assert config.kueue_manage_jobs_without_queue_name is True
    assert config.kueue_managed_jobs_namespace_selector == LabelSelector((("team", "ml"),))


@pytest.mark.parametrize(
    ("kueue", "key"),
    [
        ({"manageJobsWithoutQueueName": "yes"}, "kueue.manageJobsWithoutQueueName"),
        (
            {"managedJobsNamespaceSelector": {"matchLabels": {"a": 1}}},
            "kueue.managedJobsNamespaceSelector.matchLabels",
        ),
        (
            {
                "managedJobsNamespaceSelector": {
                    "matchExpressions": [{"key": "a", "operator": "Is"}]
                }
            },
            "kueue.managedJobsNamespaceSelector.matchExpressions[0].operator",
        ),
    ],
)
def test_bad_configuration_values_name_their_key(kueue: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_dict({"kueue": kueue})
    assert raised.value.key == key


labels = st.dictionaries(
    st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", ""]), max_size=3
)
requirements = st.builds(
    lambda key, op, values: Requirement(key, op, tuple(values) if op in ("In", "NotIn") else ()),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(labelselector.OPERATORS),
    st.lists(st.sampled_from(["x", "y", ""]), min_size=1, max_size=2),
)
selectors = st.builds(
    LabelSelector,
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"])), max_size=2).map(
        lambda pairs: tuple(dict(pairs).items())
    ),
    st.lists(requirements, max_size=3).map(tuple),
)


@given(selector=selectors, labels=labels)
def test_the_kubernetes_form_reads_back_to_the_same_verdict(
    selector: LabelSelector, labels: dict[str, str]
) -> None:
    again = labelselector.parse(selector.to_dict(), "s")
    assert again == selector
    assert again.matches(labels) is selector.matches(labels)


@given(selector=selectors, labels=labels)
def test_a_selector_is_the_and_of_its_parts(
    selector: LabelSelector, labels: dict[str, str]
) -> None:
    parts = [LabelSelector(match_labels=(pair,)) for pair in selector.match_labels] + [
        LabelSelector(match_expressions=(r,)) for r in selector.match_expressions
    ]
    assert selector.matches(labels) is all(part.matches(labels) for part in parts)


@given(labels=labels)
def test_not_in_is_the_negation_of_in(labels: dict[str, str]) -> None:
    inside = Requirement("a", "In", ("x",))
    outside = Requirement("a", "NotIn", ("x",))
    assert inside.holds_for(labels) is not outside.holds_for(labels)
