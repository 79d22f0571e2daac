"""run_all discovers the benchmarks, runs them in fresh processes and writes RESULTS.md."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import run_all
from benchmarks._common import Target, make_result, table


def test_discover_puts_ours_first() -> None:
    names = run_all.discover()
    assert names[:3] == list(run_all.ORDER)


def test_markdown_reports_every_target_with_its_verdict() -> None:
    result = make_result(
        "demo",
        params={"n": 1},
        targets=[Target("fast", 2.0, 1.0, "<=", "x"), Target("big", 5.0, 1.0, ">=", "x")],
        tables=[table("numbers", ["a", "b"], [[1, 0.5]])],
    )
    runs = [run_all.Run("bench_demo", 1.0, 0, 1, ""), run_all.Run("bench_bad", 2.0, 1, 2, "boom")]
    md = run_all.render_markdown([result], runs, 3.0, 0)
    assert "| demo | fast | 2 x | <= 1 | **NOT met** |" in md
    assert "| demo | big | 5 x | >= 1 | met |" in md
    assert "FAILED (1)" in md and "boom" in md and "**numbers**" in md


def test_main_runs_benchmarks_and_writes_results(tmp_path: Path) -> None:
    code = run_all.main(["--quick", "--out", str(tmp_path), "--only", "bench_lockstep"])
    assert code == 0
    assert json.loads((tmp_path / "lockstep.json").read_text())["benchmark"] == "lockstep"
    md = (tmp_path / "RESULTS.md").read_text()
    assert "lockstep overhead" in md and "| bench_lockstep |" in md
    assert (tmp_path / "lockstep_overhead.png").is_file()
