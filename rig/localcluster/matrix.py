"""The version matrix: the same tests, each cell on other versions, one table at the end.

``python -m rig.localcluster.matrix`` (``make test-matrix``) runs every cell; ``--cell NAME``
(repeatable) runs some (``make test`` runs ``--cell floor``). A cell is a ``Cell`` of
versions (``binaries.py``), selected for its processes by the environment variables
``HOLDWARDEN_KUBERNETES_VERSION``, ``HOLDWARDEN_KUEUE_VERSION`` and
``HOLDWARDEN_TRAINER_VERSION``, and a list of existing tests: no test is copied for a cell.
Each cell first builds what it needs (``python -m rig.localcluster``, cached like today's
binaries: a warm cell builds nothing), then runs pytest with a JUnit report, read back for
the table: per cell, per case, passed / failed / error / skipped, with the first line of
each failure's message.

Invariants: a cell whose build fails reports that and runs no test (its cases are not
"passed"); every subprocess has a time limit; the exit status is 0 only when every case
of every cell run passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rig.localcluster.binaries import (
    KUBERNETES_VERSION_ENV,
    KUEUE_VERSION_ENV,
    TRAINER_VERSION_ENV,
    Cell,
)

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ("KUBEBUILDER_ASSETS", "HOLDWARDEN_CONTROLLER_ASSETS", "HOLDWARDEN_CRDS")

# The real-controller story: both modes, the readmission gate (Kueue mode admits and
# re-admits through it), one lost-node case; and trap 3 (issue 29), whose expectation
# follows the cell's Trainer (v2.2.1 ignores spec.managedBy, v2.3.0 honours it).
REAL_STORY = (
    "tests/real/test_kueue_mode.py",
    "tests/real/test_plain_mode.py",
    "tests/real/test_trainer_managed_by.py",
    "tests/real/test_lost_node.py::test_a_lost_node_holds_readmission_until_its_pods_are_"
    "provably_gone[node-back-kueue]",
)
# The API floor: holdwarden's own APIs on kube-apiserver with CRDs only.
FLOOR = (
    "tests/controlplane/test_webhook_e2e.py",
    "tests/controlplane/test_policy_parity.py",
    "tests/controlplane/test_adapter_preflight.py::test_a_probe_refused_by_another_webhook_is_reported_as_such",
    "tests/controlplane/test_adapter_preflight.py::test_kueue_mode_enforcer_probe_is_a_workload",
    "tests/controlplane/test_install_onestep.py",
)


@dataclass(frozen=True)
class MatrixCell:
    name: str
    cell: Cell
    tests: tuple[str, ...]
    controllers: bool  # builds and runs the real Kueue, Trainer, JobSet, ... (tests/real)
    why: str


CELLS: tuple[MatrixCell, ...] = (
    MatrixCell(
        "floor",
        Cell(kubernetes="v1.30.14"),
        FLOOR,
        controllers=False,
        why="the API floor, CRDs only: the enforcer end to end, the policy twin's parity, "
        "preflight's dry-run probe, the one-step install",
    ),
    MatrixCell(
        "newest",
        Cell(kubernetes="v1.37.2"),
        REAL_STORY,
        controllers=True,
        why="the newest Kubernetes the module proxy serves, today's Kueue and Trainer",
    ),
    MatrixCell(
        "kueue-0.17",
        Cell(kueue="v0.17.0", trainer="v2.2.1"),
        REAL_STORY,
        controllers=True,
        why="the oldest Kueue/Trainer pair for TrainJob, on 1.36",
    ),
    MatrixCell("today", Cell(), REAL_STORY, controllers=True, why="today's cell"),
)


@dataclass
class CaseResult:
    case: str
    outcome: str  # passed, failed, error, skipped
    seconds: float
    message: str = ""


@dataclass
class CellResult:
    name: str
    versions: str
    build_seconds: float = 0.0
    test_seconds: float = 0.0
    build_error: str = ""
    pytest_status: int | None = None
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            not self.build_error
            and self.pytest_status == 0
            and bool(self.cases)
            and all(c.outcome == "passed" for c in self.cases)
        )


def cell_environment(cell: Cell, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # A cell claims its versions: no prebuilt binaries or CRD folder from elsewhere.
    for name in OVERRIDES:
        env.pop(name, None)
    env[KUBERNETES_VERSION_ENV] = cell.kubernetes
    env[KUEUE_VERSION_ENV] = cell.kueue
    env[TRAINER_VERSION_ENV] = cell.trainer
    return env


def read_junit(path: Path) -> list[CaseResult]:
    """The cases of a pytest JUnit report, each with its outcome and first message line."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        name = f"{module}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                text = found.get("message") or found.text or ""
                message = text.strip().splitlines()[0][:200] if text.strip() else ""
                break
        cases.append(CaseResult(name, outcome, float(case.get("time") or 0), message))
    return cases


def _run(command: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run(
            list(command), cwd=REPO, env=dict(env), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return -1, f"timed out after {timeout:.0f}s\n{out[-3000:]}"
    return done.returncode, (done.stdout + done.stderr)


def run_cell(
    matrix_cell: MatrixCell, build_timeout: float, test_timeout: float, echo: bool
) -> CellResult:
    env = cell_environment(matrix_cell.cell)
    result = CellResult(matrix_cell.name, matrix_cell.cell.describe())
    python = sys.executable
    builds = [[python, "-m", "rig.localcluster"]]
    if matrix_cell.controllers:
        builds = [[python, "-m", "rig.localcluster", "--controllers"]]
    if any("install_onestep" in t for t in matrix_cell.tests):
        builds.append([python, "-m", "tests.support.tool_binaries"])
    began = time.monotonic()
    for command in builds:
        status, output = _run(command, env, build_timeout)
        if status != 0:
            result.build_error = f"{' '.join(command[1:])} exited {status}: {output[-2000:]}"
            break
    result.build_seconds = time.monotonic() - began
    if result.build_error:
        return result
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [
            python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
            *matrix_cell.tests,
        ]  # fmt: skip
        began = time.monotonic()
        status, output = _run(command, env, test_timeout)
        result.test_seconds = time.monotonic() - began
        result.pytest_status = status
        if echo:
            print(output[-6000:], file=sys.stderr, flush=True)
        if report.is_file():
            result.cases = read_junit(report)
        else:
            result.build_error = f"pytest wrote no report (exit {status}): {output[-2000:]}"
    return result


def table(results: Sequence[CellResult]) -> str:
    lines = [
        "| cell | versions | build | tests | result |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        counts: dict[str, int] = {}
        for case in r.cases:
            counts[case.outcome] = counts.get(case.outcome, 0) + 1
        summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no test ran"
        if r.build_error:
            summary = f"not run: {r.build_error.splitlines()[0][:160]}"
        lines.append(
            f"| {r.name} | {r.versions} | {r.build_seconds:.0f}s | {r.test_seconds:.0f}s "
            f"| {'PASS' if r.passed else 'FAIL'}: {summary} |"
        )
    lines += ["", "| cell | case | outcome | seconds | message |", "|---|---|---|---|---|"]
    for r in results:
        for case in r.cases:
            lines.append(
                f"| {r.name} | {case.case} | {case.outcome} | {case.seconds:.0f} "
                f"| {case.message.replace('|', '/')} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.localcluster.matrix")
    parser.add_argument(
        "--cell", action="append", choices=[c.name for c in CELLS], help="default: every cell"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--build-timeout", type=float, default=7200.0)
    parser.add_argument("--test-timeout", type=float, default=3600.0)
    parser.add_argument("--echo", action="store_true", help="print each pytest's output tail")
    args = parser.parse_args(argv)
    chosen = [c for c in CELLS if not args.cell or c.name in args.cell]
    results = []
    for matrix_cell in chosen:
        print(
            f"holdwarden matrix: cell {matrix_cell.name} ({matrix_cell.cell.describe()}): "
            f"{matrix_cell.why}",
            file=sys.stderr,
            flush=True,
        )
        result = run_cell(matrix_cell, args.build_timeout, args.test_timeout, args.echo)
        results.append(result)
        print(table([result]).split("\n\n")[0].splitlines()[-1], file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
