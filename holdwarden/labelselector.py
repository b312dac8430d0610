"""Kubernetes label selectors: the form Kueue's ``managedJobsNamespaceSelector`` takes.

Pure: no I/O. A ``LabelSelector`` holds only a validated selector (``parse`` checks the
operators and their values as the apiserver does), ``matches`` evaluates it against a set
of labels with the apiserver's semantics, and ``to_dict`` gives back its Kubernetes form,
so a selector read from holdwarden's configuration can be written into a webhook's or a
policy binding's ``namespaceSelector`` and mean there exactly what it meant here.

Semantics (k8s.io/apimachinery ``LabelSelectorAsSelector``): every ``matchLabels`` pair
and every ``matchExpressions`` requirement must hold; an empty selector matches every set
of labels. ``In``: the key is present with one of the values; ``NotIn``: the key is absent
or its value is none of them; ``Exists`` / ``DoesNotExist``: the key is (not) present.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the apiserver on every namespace to its name."""


class SelectorError(ValueError):
    """A selector is malformed; ``path`` is the dotted path of the offending part."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry; ``values`` is empty exactly for Exists/DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out

    def holds_for(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present  # DoesNotExist (parse admits no other operator)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A validated label selector (``matchLabels`` pairs and ``matchExpressions``)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every pair and every requirement (empty: always)."""
        return all(labels.get(key) == value for key, value in self.match_labels) and all(
            requirement.holds_for(labels) for requirement in self.match_expressions
        )

    def to_dict(self) -> dict[str, Any]:
        """The Kubernetes ``LabelSelector`` form (empty parts left out)."""
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [r.to_dict() for r in self.match_expressions]
        return out

    def describe(self) -> str:
        """The selector in kubectl's string form, for messages (``a=b,c notin (x,y)``)."""
        parts = [f"{key}={value}" for key, value in self.match_labels]
        for r in self.match_expressions:
            if r.operator == "Exists":
                parts.append(r.key)
            elif r.operator == "DoesNotExist":
                parts.append(f"!{r.key}")
            else:
                parts.append(f"{r.key} {r.operator.lower()} ({','.join(r.values)})")
        return ",".join(parts) or "(every namespace)"


def kueue_default(kueue_namespace: str = "kueue-system") -> LabelSelector:
    """Kueue's own default ``managedJobsNamespaceSelector``: every namespace but
    ``kube-system`` and Kueue's (Kueue v0.19 ``apis/config/v1beta2`` defaults)."""
    return LabelSelector(
        match_expressions=(
            Requirement(NAMESPACE_NAME_LABEL, "NotIn", ("kube-system", kueue_namespace)),
        )
    )


def parse(data: Any, path: str) -> LabelSelector:
    """Read a Kubernetes ``LabelSelector`` mapping; raise ``SelectorError`` naming the part.

    Unknown keys are refused (a misspelt ``matchLabel`` would otherwise select everything).
    """
    if not isinstance(data, Mapping):
        raise SelectorError(path, "must be a label selector (matchLabels, matchExpressions)")
    unknown = sorted(str(k) for k in data if k not in ("matchLabels", "matchExpressions"))
    if unknown:
        raise SelectorError(
            f"{path}.{unknown[0]}",
            "unknown key; a label selector has matchLabels and matchExpressions",
        )
    raw_labels = data.get("matchLabels") or {}
    if not isinstance(raw_labels, Mapping):
        raise SelectorError(f"{path}.matchLabels", "must be a mapping of label keys to values")
    pairs: list[tuple[str, str]] = []
    for key, value in raw_labels.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise SelectorError(
                f"{path}.matchLabels", f"{key!r}: {value!r} is not a label key and string value"
            )
        pairs.append((key, value))
    raw_expressions = data.get("matchExpressions") or []
    if not isinstance(raw_expressions, list):
        raise SelectorError(f"{path}.matchExpressions", "must be a list of requirements")
    requirements = [
        _requirement(item, f"{path}.matchExpressions[{index}]")
        for index, item in enumerate(raw_expressions)
    ]
    return LabelSelector(tuple(pairs), tuple(requirements))


def from_flag(text: str | None, flag: str) -> LabelSelector:
    """A selector given on a command line as JSON (``flag`` names it in errors); Kueue's
    default when ``text`` is empty."""
    if not text:
        return kueue_default()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SelectorError(flag, f"not JSON: {exc}") from None
    return parse(data, flag)


def _requirement(item: Any, path: str) -> Requirement:
    if not isinstance(item, Mapping):
        raise SelectorError(path, "must be a mapping with key, operator and values")
    unknown = sorted(str(k) for k in item if k not in ("key", "operator", "values"))
    if unknown:
        raise SelectorError(f"{path}.{unknown[0]}", "unknown key; use key, operator, values")
    key, operator, values = item.get("key"), item.get("operator"), item.get("values") or []
    if not isinstance(key, str) or not key:
        raise SelectorError(f"{path}.key", "must name a label key")
    if operator not in OPERATORS:
        raise SelectorError(
            f"{path}.operator", f"{operator!r} is not one of {', '.join(OPERATORS)}"
        )
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError(f"{path}.values", "must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(f"{path}.values", f"operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"{path}.values", f"operator {operator} takes no values")
    return Requirement(key, operator, tuple(values))
