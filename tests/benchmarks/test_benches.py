"""Each benchmark runs at tiny sizes and produces a well-formed result (no timing asserts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_lockstep, bench_memory, bench_restore
from benchmarks._common import render_plots, write_result


def check_result(result: dict[str, Any], name: str) -> None:
    assert result["benchmark"] == name
    assert {"cores", "python", "docker", "platform"} <= result["machine"].keys()
    assert result["targets"] and all(
        {"name", "value", "limit", "op", "met"} <= t.keys() for t in result["targets"]
    )
    for spec in result["tables"]:
        assert spec["rows"] and all(len(row) == len(spec["columns"]) for row in spec["rows"])
    json.dumps(result, allow_nan=False)  # a plain JSON document


def test_lockstep_quick(tmp_path: Path) -> None:
    result = bench_lockstep.run(quick=True)
    check_result(result, "lockstep")
    sizes = bench_lockstep.QUICK["sizes"]
    assert [row[0] for row in result["tables"][0]["rows"]] == sizes
    assert set(result["data"]["latency"]) == set(bench_lockstep.SIDES)
    write_result(result, tmp_path)
    pngs = render_plots(result, tmp_path)
    assert {p.name for p in pngs} == {"lockstep_overhead.png", "lockstep_throughput.png"}


def test_memory_quick() -> None:
    result = bench_memory.run(quick=True)
    check_result(result, "memory")
    head = result["data"]["headline"]
    assert set(head) == set(bench_memory.CATEGORIES)
    assert head["framework"] > 0 and head["environment"] > 0
    assert len(result["data"]["sweep"]) == len(bench_memory.QUICK["sweep_lengths"])


def test_linear_fit_and_curvature() -> None:
    lengths = [1, 2, 4, 8]
    fit = bench_memory.linear_fit(lengths, [10 + 3 * t for t in lengths])
    assert fit["slope"] == pytest.approx(3) and fit["r2"] == pytest.approx(1)
    assert bench_memory.curvature(lengths, [5 + 2 * t * t for t in lengths]) == pytest.approx(2)


@pytest.mark.docker
def test_restore_quick_leaves_no_container() -> None:
    result = bench_restore.run(quick=True)
    check_result(result, "restore")
    assert result["params"]["leftover"] == 0
    assert set(result["data"]) == set(bench_restore.MODES)


def test_refill_quick() -> None:
    from benchmarks import bench_refill

    result = bench_refill.run(quick=True)
    check_result(result, "refill")
    rows = {row[0]: row for row in result["tables"][0]["rows"]}
    assert set(rows) == {"refill", "chunks"}
    # structure, not speed: one generate per round, the cap held, fewer rounds than chunks
    assert rows["refill"][2] == rows["refill"][3] and rows["refill"][4] <= 4
    assert rows["refill"][2] < rows["chunks"][2]
