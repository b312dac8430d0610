"""The layout's layers, pinned: the ground imports no part, and nothing shipped imports the
test rig.

- The ground is the ``holdwarden`` package (vocabulary, configuration, clients, object
  reads and writes, leader election), less ``holdwarden.cli``. Every part imports it, so it
  imports none of them.
- The roof is ``holdwarden.cli``: it imports every part, to name their sub-commands.
- The test rig (``rig/``: the local control plane, the demo, the shared builders), tests/
  and bench/ are development tooling: no shipped module imports them, except the roof's
  ``holdwarden demo``, which looks for the rig and explains itself when it is absent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("adapter", "webhook", "certs", "readmission")
SHIPPED = (*PARTS, "holdwarden")
TOOLING = ("rig", "tests", "bench")
ROOF = ROOT / "holdwarden" / "cli.py"


def imported_tops(path: Path) -> dict[str, int]:
    """Each top-level package ``path`` imports (absolute imports), with a line it does so."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name.split(".")[0], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.setdefault(node.module.split(".")[0], node.lineno)
    return found


def modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


GROUND = [path for path in modules("holdwarden") if path != ROOF]


@pytest.mark.parametrize("path", GROUND, ids=lambda p: p.name)
def test_the_ground_imports_no_part(path: Path) -> None:
    wrong = {top: line for top, line in imported_tops(path).items() if top in (*PARTS, *TOOLING)}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (top-level name: line)"


@pytest.mark.parametrize("path", modules(*PARTS), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_module_imports_the_tooling(path: Path) -> None:
    wrong = {top: line for top, line in imported_tops(path).items() if top in TOOLING}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (top-level name: line)"


def test_the_roof_imports_the_rig_only_for_the_demo() -> None:
    tree = ast.parse(ROOF.read_text())
    rig_imports = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in TOOLING
    ]
    assert [(n.module, [a.name for a in n.names]) for n in rig_imports] == [
        ("rig.localcluster", ["demo"])
    ]
    # ... and only inside a try that falls back when the rig is not installed.
    guarded = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(n in ast.walk(node) for n in rig_imports)
        and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers)
    ]
    assert guarded
