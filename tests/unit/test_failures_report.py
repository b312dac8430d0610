"""rig/failures.py, which reads a finished `make test`'s JUnit reports: on reports that
pytest itself wrote, with the options the Makefile gives it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rig import failures

SUITE = """
def test_passes():
    print("output of a passing test")
    assert 1 + 1 == 2

def test_fails():
    print("captured before the failure")
    assert "held" == "released", "the hold was lost"
"""


def junit(run: Path, name: str, source: str) -> Path:
    """Run pytest on ``source`` as `make test` runs a lane; its report ``run/name.xml``."""
    suite = run.parent / f"{name}_suite"
    suite.mkdir(parents=True)
    (suite / "test_suite.py").write_text(source)
    report = run / f"{name}.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short",
         f"--junitxml={report}", "-o", "junit_logging=all",
         "-o", "junit_log_passing_tests=false", str(suite)],
        capture_output=True, text=True, timeout=120, cwd=suite,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert report.is_file()
    return report


def test_a_failure_is_read_with_its_message_and_captured_output(tmp_path: Path) -> None:
    report = junit(tmp_path / "run", "pods", SUITE)
    (text,) = failures.failures(report)
    assert text.startswith("== pods: test_suite::test_fails (failure)"), text
    assert "the hold was lost" in text
    assert "captured before the failure" in text
    assert "test_passes" not in text
    # Only failures carry their output: a passing test's would make every report megabytes.
    assert "output of a passing test" not in report.read_text()


def test_main_reads_the_newest_run_and_says_how_many_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "holdwarden-test-reports"
    older = root / "20261206T100000Z-1"
    junit(older, "real", SUITE)
    os.utime(older, (time.time() - 3600, time.time() - 3600))
    newer = root / "20261206T110000Z-2"
    junit(newer, "pods", SUITE.replace('"held" == "released"', "True"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    assert failures.main([]) == 0  # the newest run passed
    assert capsys.readouterr().out.strip() == f"{newer}: 0 failed"
    assert failures.main([str(older)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{older}: 1 failed\n== real: ") and "the hold was lost" in out


def test_no_reports_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert failures.main([]) == 2
    assert "run `make test` first" in capsys.readouterr().out
