"""What ships: the wheel holds only runtime parts, and the image installs pinned, hashed
dependencies (requirements.lock) that agree with pyproject.toml."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("adapter", "webhook", "readmission", "certs")
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)")


def _lock() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes), from requirements.lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), 0)
        elif "--hash=sha256:" in line and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
    return pins


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _lock()
    stale = []
    for text in project["dependencies"]:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None or not requirement.specifier.contains(pinned[0], prereleases=True):
            stale.append(f"{requirement} (lock: {pinned[0] if pinned else 'absent'})")
    assert stale == [], f"requirements.lock is out of date ({stale}); run `make lock`"
    assert all(hashes > 0 for _, hashes in pins.values())


def test_the_image_installs_the_lock_with_hashes_and_carries_oci_labels() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "requirements.lock" in dockerfile
    for label in ("title", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{label}=" in dockerfile
    # Only what the runtime needs is copied in; no tests, no benchmarks, no manifests.
    copied = re.findall(r"^COPY (\S+)", dockerfile, flags=re.M)
    assert not {"tests/", "bench/", "manifests/", "."} & set(copied), copied


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # Built from a clean copy of what the Dockerfile copies: an in-tree build reuses a stale
    # build/ directory, and the image never sees one.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    # As COPY does: the symlinks holdwarden/adapter -> ../adapter, ... stay symlinks, and
    # the parts' folders they point at are copied beside them.
    for folder in (*PARTS, "holdwarden"):
        shutil.copytree(
            ROOT / folder,
            source / folder,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    assert (source / "holdwarden" / "adapter").is_symlink()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True,
        timeout=180,
        capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("holdwarden-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_only_the_runtime_parts(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("holdwarden-")}
    # One import namespace: no top-level adapter, webhook, certs or readmission.
    assert tops == {"holdwarden"}, tops
    assert not [n for n in names if n.startswith(("rig/", "tests/", "bench/"))]
    # Test fixtures live in tests/ (review_samples.py, once webhook/samples.py).
    assert not [n for n in names if n.endswith("samples.py")]
    assert "holdwarden/py.typed" in names
    for part in PARTS:
        # Every module of the part's folder, as a file under the namespace.
        shipped = {n for n in names if n.startswith(f"holdwarden/{part}/")}
        expected = {
            f"holdwarden/{path.relative_to(ROOT).as_posix()}"
            for path in (ROOT / part).rglob("*.py")
            if "__pycache__" not in path.parts
        }
        assert expected <= shipped, sorted(expected - shipped)
        assert f"holdwarden/{part}/py.typed" in names
        assert not wheel.getinfo(f"holdwarden/{part}/__init__.py").is_dir()
    assert "holdwarden/cli/__init__.py" in names and "holdwarden/webhook/server.py" in names
    assert "holdwarden/cli/gate.py" in names
    assert "holdwarden/readmission/controller.py" in names


def test_the_console_entry_points_name_the_namespace(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    lines = wheel.read(entry_points).decode().splitlines()
    assert "holdwarden = holdwarden.cli:main" in lines
    assert "kubectl-holdwarden = holdwarden.cli:kubectl_main" in lines


def test_the_cli_explains_the_demo_where_it_is_not_installed() -> None:
    """Without the local control plane (the image), `holdwarden demo` says why, exit 2."""
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guarded(name, *a, **k):\n"
        "    if name.startswith('rig.localcluster'):\n"
        "        raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guarded\n"
        "from holdwarden.cli import main\n"
        "sys.exit(main(['demo']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 2, result.stderr
    assert "make demo" in result.stderr
