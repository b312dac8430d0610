"""The layout's layers, pinned: the ground imports no part, a part imports no other part,
and nothing shipped imports the test rig.

- The ground is the ``holdwarden`` package (vocabulary, configuration, clients, object
  reads and writes, leader election), less ``holdwarden.cli``. Every part imports it, so it
  imports none of them.
- The parts (adapter, webhook, certs, readmission) each import the ground and themselves,
  never one another. What one part needs of another is handed to it by the roof (the
  self-managed certificates verify the enforcer with the adapter's preflight probe, a
  function the roof passes in: ``holdwarden.cli.serve.verify_enforcer``).
- The roof is the ``holdwarden.cli`` package, the composition root: it names every part's
  sub-commands and assembles the two processes, ``holdwarden serve`` (the enforcer) and
  ``holdwarden gate`` (the readmission gate).
- The test rig (``rig/``: the local control plane, the demo, the shared builders), tests/
  and bench/ are development tooling: no shipped module imports them, except the roof's
  ``holdwarden demo``, which looks for the rig and explains itself when it is absent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("adapter", "webhook", "certs", "readmission")
SHIPPED = (*PARTS, "holdwarden")
TOOLING = ("rig", "tests", "bench")
ROOF = ROOT / "holdwarden" / "cli"
ROOF_ENTRY = ROOF / "__init__.py"
# A part's import of another part that cannot be avoided, as (importer path, imported top).
# Empty: none is needed.
CROSS_PART_ALLOWED: frozenset[tuple[str, str]] = frozenset()


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


GROUND = [path for path in modules("holdwarden") if ROOF not in path.parents]


@pytest.mark.parametrize("path", GROUND, ids=lambda p: p.name)
def test_the_ground_imports_no_part(path: Path) -> None:
    wrong = {top: line for top, line in imported_tops(path).items() if top in (*PARTS, *TOOLING)}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (top-level name: line)"


def test_the_roof_is_a_package_outside_the_ground() -> None:
    assert ROOF_ENTRY.is_file()
    assert not any(ROOF in path.parents for path in GROUND)
    assert {p.name for p in ROOF.glob("*.py")} >= {"__init__.py", "serve.py", "gate.py"}


@pytest.mark.parametrize("path", modules(*PARTS), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_part_imports_no_other_part(path: Path) -> None:
    """Also imports inside functions (``ast.walk`` sees every import statement)."""
    own = path.relative_to(ROOT).parts[0]
    relative = str(path.relative_to(ROOT))
    wrong = {
        top: line
        for top, line in imported_tops(path).items()
        if top in PARTS and top != own and (relative, top) not in CROSS_PART_ALLOWED
    }
    assert not wrong, f"{relative} imports another part: {wrong} (top-level name: line)"


def test_the_gate_and_the_enforcer_are_separate_processes() -> None:
    """``holdwarden serve`` starts no readmission gate: the enforcer's process modules
    import nothing of readmission/, and the gate's nothing of webhook/ or certs/."""
    enforcer = {top for name in ("serve.py", "enforcer.py") for top in imported_tops(ROOF / name)}
    gate = {top for name in ("gate.py", "gateserver.py") for top in imported_tops(ROOF / name)}
    assert "readmission" not in enforcer
    assert not gate & {"webhook", "certs", "adapter"}


@pytest.mark.parametrize("path", modules(*PARTS), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_module_imports_the_tooling(path: Path) -> None:
    wrong = {top: line for top, line in imported_tops(path).items() if top in TOOLING}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (top-level name: line)"


def test_the_roof_imports_the_rig_only_for_the_demo() -> None:
    tree = ast.parse(ROOF_ENTRY.read_text())
    for module in ROOF.glob("*.py"):
        if module != ROOF_ENTRY:
            assert not set(imported_tops(module)) & set(TOOLING), module
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
