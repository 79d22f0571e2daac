"""The agent-RL bench's reporting: runs written one seed per file combine into one table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import bench_agent_rl

CONFIG = {
    "steps": 2,
    "episodes_per_step": 16,
    "value_rollouts": 2,
    "heldout_episodes": 32,
    "warmup_reads_listing": 0.75,
    "lr_floor": 0.1,
}


def run(seed: int, after: float, hit_at: int | None = None) -> SimpleNamespace:
    """One run's result as the loop returns it: (step, rollouts, wall s, held-out) per point,
    and the exact success after the warm-up and each update."""
    mid = 0.8 if hit_at == 1 else 0.2
    curve = [(0, 0, 0.0, 0.1), (1, 80, 50.0, mid), (2, 160, 100.0 + seed, after)]
    exact = [0.2, 0.3, after + 0.05]
    return SimpleNamespace(
        estimator="vine", seed=seed, before=0.1, after=after, curve=curve, exact=exact
    )


def test_seeds_written_apart_combine_into_one_table(tmp_path: Path) -> None:
    bench_agent_rl.write([run(0, 0.3, hit_at=1)], CONFIG, tmp_path, "s0")
    bench_agent_rl.write([run(1, 0.5)], CONFIG, tmp_path, "s1")
    config, results = bench_agent_rl.combine([tmp_path / "s0.json", tmp_path / "s1.json"])
    assert config == CONFIG
    assert [r.seed for r in results] == [0, 1]
    text = bench_agent_rl.write(results, config, tmp_path, "all")
    assert "2 seeds x 2 steps" in text
    assert "Warm-up: 0.75 of its labels" in text and "decaying to 0.1 of itself" in text
    # mean 0.4 of (0.3, 0.5); t(1) = 12.706 makes the interval reach past both ends: cut
    row = "| vine | 2 | 0.10 [0.10, 0.10] | 0.40 [0.00, 1.00] | 0.45 [0.00, 1.00] | 160 | 100 |"
    row += " 1, - |"
    assert row in text
    assert "| vine | 1 | 0.10 | 0.20 | 0.50 | 0.50 | 0.20 -> 0.55 |" in text
    assert (tmp_path / "all.png").stat().st_size > 0
    saved = json.loads((tmp_path / "all.json").read_text())
    assert [r["curve"][-1] for r in saved["runs"]] == [[2, 160, 100.0, 0.3], [2, 160, 101.0, 0.5]]
    assert [r["exact"] for r in saved["runs"]] == [[0.2, 0.3, 0.35], [0.2, 0.3, 0.55]]


def test_runs_written_before_the_exact_success_was_recorded_report_none(tmp_path: Path) -> None:
    """An old file's run has no exact curve: its cells say so, and the estimator's mean is
    left out rather than taken over the runs that have one."""
    old = run(0, 0.3)
    del old.exact
    text = bench_agent_rl.write([old, run(1, 0.5)], CONFIG, tmp_path, "mixed")
    assert "| vine | 2 | 0.10 [0.10, 0.10] | 0.40 [0.00, 1.00] | - | 160 | 100 | -, - |" in text
    assert "| vine | 0 | 0.10 | 0.20 | 0.30 | 0.30 | - |" in text
    assert "| vine | 1 | 0.10 | 0.20 | 0.50 | 0.50 | 0.20 -> 0.55 |" in text


def test_runs_of_different_configs_do_not_combine(tmp_path: Path) -> None:
    bench_agent_rl.write([run(0, 0.3)], CONFIG, tmp_path, "a")
    bench_agent_rl.write([run(1, 0.5)], {**CONFIG, "value_rollouts": 4}, tmp_path, "b")
    with pytest.raises(SystemExit, match=r"b\.json: config .*'value_rollouts': 4"):
        bench_agent_rl.combine([tmp_path / "a.json", tmp_path / "b.json"])
    bench_agent_rl.write([run(1, 0.5)], {**CONFIG, "lr_floor": 1.0}, tmp_path, "c")
    with pytest.raises(SystemExit, match=r"c\.json: config .*'lr_floor': 1\.0"):
        bench_agent_rl.combine([tmp_path / "a.json", tmp_path / "c.json"])


def test_runs_written_before_the_settings_were_recorded_still_report() -> None:
    old = {k: v for k, v in CONFIG.items() if k not in ("warmup_reads_listing", "lr_floor")}
    assert bench_agent_rl.settings(old) == ""
    assert "0.75 of its labels" in bench_agent_rl.settings(CONFIG)


def test_interval_stays_in_the_success_range() -> None:
    assert bench_agent_rl.interval([0.5]) == (0.5, 0.5, 0.5)
    mean, lo, hi = bench_agent_rl.interval([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5)
    assert lo == pytest.approx(0.5 - 4.303 * 0.1 / 3**0.5)
    assert hi == pytest.approx(0.5 + 4.303 * 0.1 / 3**0.5)
    assert bench_agent_rl.interval([0.0, 1.0]) == (0.5, 0.0, 1.0)
