"""The schedule benchmark runs at tiny sizes and produces a well-formed result."""

from __future__ import annotations

from benchmarks import bench_schedule

from .test_benches import check_result


def test_schedule_quick() -> None:
    result = bench_schedule.run(quick=True)
    check_result(result, "schedule")
    rows = {row[0]: row for row in result["tables"][0]["rows"]}
    assert set(rows) == {"async", "refill", "chunks"}
    steps = bench_schedule.QUICK["inputs"] * bench_schedule.QUICK["steps"]
    batch = bench_schedule.QUICK["batch_size"]
    # structure, not speed: lockstep makes one call per round with full batches; async
    # makes more, smaller calls; every call count covers every step; caps held
    assert rows["refill"][2] == rows["chunks"][2] == steps // batch
    assert rows["async"][2] >= rows["refill"][2]
    for _, _, calls, mean_batch, peak in rows.values():
        assert round(calls * mean_batch) == steps and peak <= batch
    names = {t["name"]: t for t in result["targets"]}
    assert names["identical trajectories across schedules"]["value"] == 1.0
