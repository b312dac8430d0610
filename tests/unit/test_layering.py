"""The layout's layers, pinned: the ground imports no part, a part imports no other part,
nothing shipped imports the test rig, and the parts are imported by one name only.

- One import namespace: the parts are ``holdwarden.adapter``, ``holdwarden.webhook``,
  ``holdwarden.certs`` and ``holdwarden.readmission``. Their folders stay at the top of the
  checkout (``adapter/``, ...; the design card lays them out so) and ``holdwarden/adapter``,
  ... are relative symlinks to them (docs/explanation/layout.md). The old top-level names
  still resolve in a checkout, so no module may import them: one file loaded under two
  names is two modules, with two sets of classes.
- The ground is the ``holdwarden`` package (vocabulary, configuration, clients, object
  reads and writes, leader election), less ``holdwarden.cli`` and the four parts. Every
  part imports it, so it imports none of them.
- The parts each import the ground and themselves, never one another. What one part needs
  of another is handed to it by the roof (the self-managed certificates verify the enforcer
  with the adapter's preflight probe, a function the roof passes in:
  ``holdwarden.cli.serve.verify_enforcer``).
- The roof is the ``holdwarden.cli`` package, the composition root: it names every part's
  sub-commands and assembles the two processes, ``holdwarden serve`` (the enforcer) and
  ``holdwarden gate`` (the readmission gate).
- The test rig (``rig/``: the local control plane, the demo and the shared builders), tests/
  and bench/ are development tooling: no shipped module imports them, except the roof's
  ``holdwarden demo``, which looks for the rig and explains itself when it is absent.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "holdwarden"
PARTS = ("adapter", "webhook", "certs", "readmission")
TOOLING = ("rig", "tests", "bench")
ROOF = ROOT / NAMESPACE / "cli"
ROOF_ENTRY = ROOF / "__init__.py"
# A part's import of another part that cannot be avoided, as (importer path, imported part).
# Empty: none is needed.
CROSS_PART_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    """The dotted name ``path`` is imported by: a part's files under the namespace."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in PARTS:
        parts.insert(0, NAMESPACE)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> dict[str, int]:
    """Each module ``path`` imports (``from P import name`` counts as ``P.name`` too, and a
    relative import is resolved against ``path``'s own package), with a line it does so."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.setdefault(module, node.lineno)
            for alias in node.names:
                found.setdefault(f"{module}.{alias.name}", node.lineno)
    return found


def part_of(module: str) -> str | None:
    """The part a module name belongs to (``holdwarden.webhook.server`` -> ``webhook``)."""
    names = module.split(".")
    if names[0] == NAMESPACE and len(names) > 1 and names[1] in PARTS:
        return names[1]
    return None


def tops_of(path: Path) -> dict[str, int]:
    """The top-level names ``path``'s absolute imports start with, with a line."""
    tops: dict[str, int] = {}
    for module, line in imported_modules(path).items():
        tops.setdefault(module.split(".")[0], line)
    return tops


def modules(*folders: str) -> list[Path]:
    """The ``.py`` files under the real folders; symlinked folders are not walked, so each
    file is listed once (the parts' under their own folders)."""
    found = []
    for folder in folders:
        for directory, dirs, files in os.walk(ROOT / folder):
            dirs[:] = [d for d in dirs if not (Path(directory) / d).is_symlink()]
            found += [Path(directory) / f for f in files if f.endswith(".py")]
    return sorted(found)


GROUND = [path for path in modules(NAMESPACE) if ROOF not in path.parents]
EVERY_MODULE = modules(NAMESPACE, *PARTS, *TOOLING)


def test_each_part_is_a_symlink_in_the_namespace() -> None:
    for part in PARTS:
        link = ROOT / NAMESPACE / part
        assert link.is_symlink(), f"{link.relative_to(ROOT)} is not a symlink"
        assert os.readlink(link) == f"../{part}", os.readlink(link)
        assert (ROOT / part / "__init__.py").is_file()


@pytest.mark.parametrize("path", EVERY_MODULE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_part_by_its_old_top_level_name(path: Path) -> None:
    """``import adapter`` still resolves in a checkout (its root is on the path), and would
    load a second copy of the part; every import names ``holdwarden.adapter``."""
    wrong = {top: line for top, line in tops_of(path).items() if top in PARTS}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (old top-level name: line)"


@pytest.mark.parametrize("path", GROUND, ids=lambda p: p.name)
def test_the_ground_imports_no_part(path: Path) -> None:
    wrong = {
        module: line
        for module, line in imported_modules(path).items()
        if part_of(module) or module.split(".")[0] in (*PARTS, *TOOLING)
    }
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (module: line)"


def test_the_roof_is_a_package_outside_the_ground() -> None:
    assert ROOF_ENTRY.is_file()
    assert not any(ROOF in path.parents for path in GROUND)
    assert not any(part in path.relative_to(ROOT).parts for path in GROUND for part in PARTS)
    assert {p.name for p in ROOF.glob("*.py")} >= {"__init__.py", "serve.py", "gate.py"}


@pytest.mark.parametrize("path", modules(*PARTS), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_part_imports_no_other_part(path: Path) -> None:
    """Also imports inside functions (``ast.walk`` sees every import statement)."""
    own = path.relative_to(ROOT).parts[0]
    relative = str(path.relative_to(ROOT))
    wrong = {
        module: line
        for module, line in imported_modules(path).items()
        if (part := part_of(module) or (module if module in PARTS else None))
        and part != own
        and (relative, part) not in CROSS_PART_ALLOWED
    }
    assert not wrong, f"{relative} imports another part: {wrong} (module: line)"


def test_the_gate_and_the_enforcer_are_separate_processes() -> None:
    """``holdwarden serve`` starts no readmission gate: the enforcer's process modules
    import nothing of readmission/, and the gate's nothing of webhook/ or certs/."""

    def parts(*names: str) -> set[str | None]:
        return {part_of(m) for name in names for m in imported_modules(ROOF / name)}

    enforcer, gate = parts("serve.py", "enforcer.py"), parts("gate.py", "gateserver.py")
    assert "webhook" in enforcer and "readmission" in gate  # the check sees the imports
    assert "readmission" not in enforcer
    assert not gate & {"webhook", "certs", "adapter"}


@pytest.mark.parametrize("path", modules(*PARTS), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_module_imports_the_tooling(path: Path) -> None:
    wrong = {top: line for top, line in tops_of(path).items() if top in TOOLING}
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong} (top-level name: line)"


def test_the_roof_imports_the_rig_only_for_the_demo() -> None:
    tree = ast.parse(ROOF_ENTRY.read_text())
    for module in ROOF.glob("*.py"):
        if module != ROOF_ENTRY:
            assert not set(tops_of(module)) & set(TOOLING), module
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
