"""The docs by kind stay true to their sources: the metrics reference names exactly the
metrics the code defines, every relative link between pages resolves, and no reference
page tells history (docs/index.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
METRIC_SOURCES = ("webhook", "readmission", "certs", "holdwarden")


def _defined_metrics() -> set[str]:
    """Every metric name the code spells (counters without the ``_total`` suffix that
    prometheus_client adds)."""
    names: set[str] = set()
    for folder in METRIC_SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r"\"(holdwarden_[a-z_]+)\"", path.read_text()))
    return names


def test_the_metrics_reference_names_every_metric_and_no_other() -> None:
    text = (DOCS / "reference" / "metrics.md").read_text()
    spelled = re.findall(r"`(holdwarden_[a-z_]+)", text)
    documented = {name.removesuffix("_total") for name in spelled}
    defined = {name.removesuffix("_total") for name in _defined_metrics()}
    assert documented == defined, (
        f"only in docs/reference/metrics.md: {sorted(documented - defined)}; "
        f"only in the code: {sorted(defined - documented)}"
    )


def test_every_relative_link_between_pages_resolves() -> None:
    broken = []
    for page in sorted(DOCS.rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            external = target.startswith(("http://", "https://"))
            if not external and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_no_reference_page_tells_history() -> None:
    history = re.compile(r"\bused to\b|\bstop \d+\b|\bbefore the change\b|\bno longer\b", re.I)
    told = [
        f"{page.relative_to(ROOT)}: {match.group(0)!r}"
        for page in sorted((DOCS / "reference").glob("*.md"))
        for match in history.finditer(page.read_text())
    ]
    assert not told, told


def test_the_cli_reference_names_every_command_and_option() -> None:
    """docs/reference/cli.md against the parser itself: every sub-command, and every long
    option of the commands it documents in full (certs and demo have their own pages)."""
    import argparse

    from holdwarden.cli import build_parser

    text = (DOCS / "reference" / "cli.md").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name in commands.choices if f"holdwarden {name}" not in text]
    for name, command in commands.choices.items():
        if name in ("certs", "demo"):
            continue
        for action in command._actions:
            missing += [
                f"holdwarden {name} {option}"
                for option in action.option_strings
                if option.startswith("--") and option != "--help" and option not in text
            ]
    assert not missing, missing


def test_the_rules_reference_lists_the_rules_in_their_evaluation_order() -> None:
    """docs/reference/rules.md's table against webhook/rules.py: CREATE and UPDATE rules in
    ``RULE_ORDER``, then the DELETE rule."""
    from holdwarden.webhook.rules import DELETE_RULE_ORDER, RULE_ORDER

    text = (DOCS / "reference" / "rules.md").read_text()
    table = re.findall(r"^\| \d+ \| `([a-z-]+)`", text, flags=re.MULTILINE)
    assert table == [str(rule) for rule, _ in RULE_ORDER + DELETE_RULE_ORDER]
