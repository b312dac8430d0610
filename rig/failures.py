"""The failures of a finished `make test`, read from its JUnit reports.

``make test`` has every pytest run write ``<folder>/<lane>.xml`` under
``$TMPDIR/holdwarden-test-reports`` (Makefile, ``TEST_REPORTS``), outside the checkout, so
that a run in a clone that is gone can still be read. ``python -m rig.failures`` prints
each failed or erroring test of the newest run's reports (or of the folder given): its
name, its message and traceback, and the output it captured.
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path


def reports_root() -> Path:
    """Where ``make test`` puts its runs' folders (as the Makefile computes it)."""
    return Path(os.environ.get("TMPDIR") or "/tmp") / "holdwarden-test-reports"


def newest_run(root: Path) -> Path | None:
    """The most recently changed run folder under ``root``, or None if there is none."""
    runs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def failures(report: Path) -> Iterator[str]:
    """Each failed or erroring test case of one JUnit report, as printable text."""
    for case in ElementTree.parse(report).iter("testcase"):
        for problem in [*case.findall("failure"), *case.findall("error")]:
            name = f"{case.get('classname')}::{case.get('name')}"
            parts = [f"== {report.stem}: {name} ({problem.tag})", problem.text or ""]
            for section in ("system-out", "system-err"):
                captured = case.findtext(section)
                if captured:
                    parts += [f"-- {section}", captured]
            yield "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.failures", description=__doc__)
    parser.add_argument("run", nargs="?", type=Path, help="a run's folder (default: newest)")
    args = parser.parse_args(argv)
    run = args.run or newest_run(reports_root())
    if run is None or not run.is_dir():
        print(f"no test reports in {args.run or reports_root()}: run `make test` first")
        return 2
    found = [text for report in sorted(run.glob("*.xml")) for text in failures(report)]
    print(f"{run}: {len(found)} failed", *found, sep="\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
