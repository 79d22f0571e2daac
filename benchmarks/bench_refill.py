"""Refill vs chunks: 64 inputs with long-tailed episode lengths at batch_size 8.

Chunks wait for each chunk's slowest rollout; refill gives a freed slot to the next input,
which joins the next round. Both run the same CounterEnv instances (latency per step) and a
backend with a fixed cost per batched generate call, one run after the other, repeated.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from statistics import median
from typing import Any

from llenvs_async import TrajectoryRunner
from llenvs_async._loop import run as run_on_loop
from llenvs_async.envs import CounterEnv, InstanceTracker

from ._common import Result, Target, bench_main, make_result, table
from ._workload import LatencyBackend

__all__ = ["lengths", "main", "run"]

FULL: dict[str, Any] = {
    "inputs": 64,
    "batch_size": 8,
    "generate_latency_s": 0.010,
    "env_latency_s": 0.002,
    "pareto_alpha": 1.2,
    "max_length": 18,
    "repeats": 3,
}
QUICK: dict[str, Any] = {**FULL, "inputs": 12, "batch_size": 4, "repeats": 1}
SCHEDULES = ("refill", "chunks")


def lengths(n: int, alpha: float, cap: int, seed: int = 11) -> list[int]:
    """Episode targets from a Pareto tail: most episodes short, a few long (capped)."""
    rng = random.Random(seed)
    return [min(int(rng.paretovariate(alpha)), cap) for _ in range(n)]


async def _one(schedule: str, targets: Sequence[int], p: dict[str, Any]) -> dict[str, float]:
    tracker = InstanceTracker()

    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=p["env_latency_s"])

    backend = LatencyBackend(p["generate_latency_s"])
    runner = TrajectoryRunner(CounterEnv(), backend, env_factory=factory)
    started = time.perf_counter()
    trajs = await runner.run_batch(
        list(targets),
        batch_size=p["batch_size"],
        schedule=schedule,  # type: ignore[arg-type]
    )
    wall = time.perf_counter() - started
    assert all(t.success for t in trajs) and tracker.live == 0
    return {
        "wall": wall,
        "rounds": runner.stats.rounds,
        "generate_calls": runner.stats.generate_calls,
        "peak_live": runner.stats.peak_live_instances,
    }


def run(quick: bool = False) -> Result:
    p = QUICK if quick else FULL
    targets = lengths(p["inputs"], p["pareto_alpha"], p["max_length"])
    samples: dict[str, list[dict[str, float]]] = {s: [] for s in SCHEDULES}
    for _ in range(p["repeats"]):
        for schedule in SCHEDULES:  # interleaved: noise hits both alike
            samples[schedule].append(run_on_loop(_one(schedule, targets, p)))
    ratio = median(r["wall"] / c["wall"] for r, c in zip(*samples.values(), strict=True))
    steps = sum(t + 1 for t in targets)
    rows = [
        [
            s,
            median(x["wall"] for x in samples[s]),
            median(x["rounds"] for x in samples[s]),
            median(x["generate_calls"] for x in samples[s]),
            max(x["peak_live"] for x in samples[s]),
        ]
        for s in SCHEDULES
    ]
    refill = samples["refill"]
    one_per_round = all(x["generate_calls"] == x["rounds"] for x in refill)
    return make_result(
        "refill",
        params=p,
        targets=[
            Target("refill wall / chunks wall", ratio, 0.7, "<=", "x", "median of ratios"),
            Target(
                "generate calls per round (refill)",
                1.0 if one_per_round else 0.0,
                1.0,
                ">=",
                "",
                "1 when every round made exactly one call",
            ),
            Target(
                "live instances high-water (refill)",
                max(x["peak_live"] for x in refill),
                p["batch_size"],
                "<=",
                "",
                "runner.stats.peak_live_instances",
            ),
        ],
        tables=[
            table(
                f"{p['inputs']} inputs, batch_size {p['batch_size']}, {steps} steps in all "
                f"(lower bound {-(-steps // p['batch_size'])} rounds)",
                ["schedule", "wall s", "rounds", "generate calls", "peak live"],
                rows,
            )
        ],
        notes=[
            f"Episode lengths (steps) {sorted((t + 1 for t in targets), reverse=True)[:8]}... "
            f"drawn from Pareto(alpha={p['pareto_alpha']}), capped at {p['max_length'] + 1}.",
            f"Each round: one generate ({p['generate_latency_s'] * 1e3:.0f} ms) then every step "
            f"({p['env_latency_s'] * 1e3:.0f} ms) concurrently.",
        ],
        data={"samples": samples, "targets": targets},
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main()
