"""rig/find-python, which `make test-pythons` uses to find each Python the wheel accepts:
pyenv's newest final X.Y.N, else pythonX.Y on PATH, else a clear message and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIND = Path(__file__).resolve().parents[2] / "rig" / "find-python"


def find(version: str, root: Path, path: str) -> subprocess.CompletedProcess[str]:
    """rig/find-python with pyenv's root at ``root`` and ``path`` as PATH (no pyenv on it)."""
    env = {"PATH": path, "PYENV_ROOT": str(root), "HOME": str(root)}
    return subprocess.run(
        ["/bin/sh", str(FIND), version], env=env, capture_output=True, text=True, timeout=30
    )


def fake_python(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / name
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return binary


def test_a_missing_python_names_the_version_and_how_to_install_it(tmp_path: Path) -> None:
    found = find("3.99", tmp_path, "/usr/bin:/bin")
    assert found.returncode == 1
    assert found.stdout == ""
    assert "Python 3.99 is missing" in found.stderr
    assert "pyenv install 3.99" in found.stderr and "python3.99 on PATH" in found.stderr


def test_not_a_version_is_a_usage_error(tmp_path: Path) -> None:
    found = find("latest", tmp_path, "/usr/bin:/bin")
    assert found.returncode == 2
    assert "expected a version like 3.12, got 'latest'" in found.stderr


def test_pyenvs_newest_final_release_is_chosen(tmp_path: Path) -> None:
    for version in ("3.98.2", "3.98.10", "3.98.11t", "3.98-dev"):
        fake_python(tmp_path / "versions" / version / "bin", "python3.98")
    found = find("3.98", tmp_path, "/usr/bin:/bin")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(tmp_path / "versions" / "3.98.10" / "bin" / "python3.98")


def test_without_pyenv_python_on_path_is_used(tmp_path: Path) -> None:
    binary = fake_python(tmp_path / "bin", "python3.97")
    found = find("3.97", tmp_path / "no-pyenv", f"{binary.parent}:/usr/bin:/bin")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(binary)


def test_this_interpreters_version_is_found() -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = subprocess.run(
        ["/bin/sh", str(FIND), version], capture_output=True, text=True, timeout=30,
        env=dict(os.environ),
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).name == f"python{version}"
