"""bench/scale_plot.py draws the scale figure from scale_bench's own JSON shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.scale_plot import plot


def _row(n: int) -> dict[str, Any]:
    update = {
        tag: {
            f"{kind} {q}": base + n / 10_000
            for kind in ("TrainJob", "Workload")
            for q in ("p50", "p99")
        }
        for tag, base in (("none", 4.0), ("webhook", 5.5), ("policy", 5.0))
    }
    holds = {
        verb: {"calls": 1000, "ok": 1000, "failures": 0, "calls_per_s": rate, "p50_ms": 1.0,
               "p99_ms": 2.0, "lost": 0, "doubled": 0}
        for verb, rate in (("hold", 150_000 / n), ("release", 190.0))
    }  # fmt: skip
    return {"populate_s": 1.0, "update_ms": update, "holds": holds}


def test_the_plot_is_drawn_from_the_benchmarks_json(tmp_path: Path) -> None:
    report = {"sizes": {str(n): _row(n) for n in (1000, 10_000, 100_000)}, "gate": {}}
    out = tmp_path / "scale.png"
    plot(report, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # two panels with lines, not an empty canvas


def test_the_shipped_figure_can_be_redrawn_from_the_shipped_json(tmp_path: Path) -> None:
    """docs/performance/scale.png is drawn from docs/performance/scale.json: the numbers in
    the docs can be checked."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "performance"
    report = json.loads((docs / "scale.json").read_text())
    for row in report["sizes"].values():
        for verb in ("hold", "release"):
            assert row["holds"][verb]["lost"] == row["holds"][verb]["doubled"] == 0
    out = tmp_path / "scale.png"
    plot(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
