"""Resident memory per active rollout (10,000 concurrent pure rollouts) and how it grows
with trajectory length, attributed to framework, environment and backend by tracemalloc.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llenvs_async
from llenvs_async import (
    Completion,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async.envs import ChainEnv

from ._common import Result, Target, bench_main, make_result, plot, table

__all__ = ["main", "run"]

FULL: dict[str, Any] = {
    "rollouts": 10_000,
    "length": 10,
    "sweep_rollouts": 300,
    "sweep_lengths": [5, 10, 20, 40, 80],
    "frames": 4,
}
QUICK: dict[str, Any] = {
    "rollouts": 40,
    "length": 3,
    "sweep_rollouts": 20,
    "sweep_lengths": [2, 4, 8],
    "frames": 4,
}
LIMIT_BYTES = 4096
GROWTH_LIMIT = 1.25
PACKAGE = Path(llenvs_async.__file__).resolve().parent
CATEGORIES = ("framework", "environment", "backend", "other")
_OWNERS = ((PACKAGE / "envs", "environment"), (PACKAGE / "backends", "backend"))
# Where the value types live: llenvs_async.types and the modules it re-exports.
_VALUES = (PACKAGE / "types.py", PACKAGE / "_generation.py", PACKAGE / "_history.py")


class ProbeBackend(ScriptedBackend):
    """Always answers ``right``; calls ``probe`` once, when the rollouts have ``length`` steps."""

    def __init__(self, length: int, probe: Callable[[], None]) -> None:
        super().__init__(lambda request: "right")
        self.length = length
        self.probe = probe

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        if self.calls == self.length:
            self.probe()
        return await super().generate(requests, params)


async def _run_to_probe(
    rollouts: int, length: int, before: Callable[[], None], probe: Callable[[], None]
) -> None:
    """Run ``rollouts`` ChainEnv rollouts that take ``length + 1`` steps; ``probe`` fires
    mid-run, when every rollout is active and holds ``length`` transitions.
    """
    env = ChainEnv(min_length=length + 1, num_tasks=1, max_steps=length + 2)
    runner = TrajectoryRunner(environment=env, backend=ProbeBackend(length, probe))
    tasks = [0] * rollouts
    gc.collect()
    before()
    trajs = await runner.run_batch(tasks)
    assert all(t.success and len(t) == length + 1 for t in trajs), "rollouts did not finish"


def _category(trace: tracemalloc.Traceback) -> str:
    """Who allocated: the innermost frame inside llenvs_async decides; none -> other.
    Value types (``types.py``, ``_history.py``) are built on behalf of their caller: an
    environment's ``state.advance`` allocates the state's history node for the environment.
    """
    for frame in reversed(trace):
        path = Path(frame.filename)
        if PACKAGE not in path.parents or path in _VALUES:
            continue
        for folder, name in _OWNERS:
            if folder in path.parents:
                return name
        return "framework"
    return "other"


def traced_bytes(rollouts: int, length: int, frames: int) -> dict[str, float]:
    """Bytes per active rollout allocated since the run began and still live, by category."""
    snapshots: list[tracemalloc.Snapshot] = []

    def snap() -> None:
        gc.collect()
        snapshots.append(tracemalloc.take_snapshot())

    tracemalloc.start(frames)
    try:
        asyncio.run(_run_to_probe(rollouts, length, snap, snap))
    finally:
        tracemalloc.stop()
    base, probe = snapshots
    sizes = dict.fromkeys(CATEGORIES, 0)
    for diff in probe.compare_to(base, "traceback"):
        sizes[_category(diff.traceback)] += diff.size_diff
    return {name: size / rollouts for name, size in sizes.items()}


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_bytes(rollouts: int, length: int) -> float:
    """Resident-set growth per active rollout (no tracemalloc), from run start to the probe."""
    marks: list[int] = []
    asyncio.run(
        _run_to_probe(rollouts, length, lambda: marks.append(_rss()), lambda: marks.append(_rss()))
    )
    return (marks[1] - marks[0]) / rollouts


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least-squares ``y = intercept + slope * x`` and its R^2."""
    slope, intercept = statistics.linear_regression(xs, ys)
    mean = statistics.fmean(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys) or 1.0
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"intercept": intercept, "slope": slope, "r2": 1 - ss_res / ss_tot}


def step_cost(lengths: Sequence[int], ys: Sequence[float]) -> list[float]:
    """Bytes each additional step costs, between consecutive lengths."""
    return [(ys[i] - ys[i - 1]) / (lengths[i] - lengths[i - 1]) for i in range(1, len(lengths))]


def curvature(lengths: Sequence[int], ys: Sequence[float]) -> float:
    """``c`` of ``y = a + b*T + c*T^2``: half the slope of the step cost against T."""
    mids = [(lengths[i] + lengths[i - 1]) / 2 for i in range(1, len(lengths))]
    return statistics.linear_regression(mids, step_cost(lengths, ys))[0] / 2


def run(quick: bool = False) -> Result:
    """Headline per-rollout memory at N rollouts, then the sweep over trajectory lengths."""
    p = QUICK if quick else FULL
    n, length = p["rollouts"], p["length"]
    rss_bytes(10, 2)  # warm-up: lazy imports and first-call caches
    rss = rss_bytes(n, length)  # before tracemalloc runs, while the heap is fresh
    head = traced_bytes(n, length, p["frames"])
    lengths: list[int] = p["sweep_lengths"]
    sweep = [traced_bytes(p["sweep_rollouts"], t, p["frames"]) for t in lengths]
    totals = [sum(s.values()) for s in sweep]
    framework = [s["framework"] for s in sweep]
    series = {"total": totals, "framework": framework}
    fits = {name: linear_fit(lengths, ys) for name, ys in series.items()}
    fw = fits["framework"]
    per_step = {"total": step_cost(lengths, totals), "framework": step_cost(lengths, framework)}
    growth = per_step["total"][-1] / per_step["total"][0]
    targets = [
        Target(
            f"framework bytes per active rollout (N={n}, T={length})",
            head["framework"] + head["other"],
            LIMIT_BYTES,
            "<=",
            "B",
            "tracemalloc: framework + unattributed, beyond environment-made states",
        ),
        Target(
            f"linear growth: bytes per step at T={lengths[-1]} / at T={lengths[0]}",
            growth,
            GROWTH_LIMIT,
            "<=",
            "x",
            "all categories; 1.0 = linear",
        ),
    ]
    sweep_rows = [
        [t, s["framework"], s["environment"], s["backend"] + s["other"], total, f, c]
        for t, s, total, f, c in zip(
            lengths,
            sweep,
            totals,
            ["-", *per_step["framework"]],
            ["-", *per_step["total"]],
            strict=True,
        )
    ]
    return make_result(
        "memory",
        params=p,
        targets=targets,
        tables=[
            table(
                f"Bytes per active rollout: {n} concurrent ChainEnv rollouts, {length} steps each",
                [
                    "framework",
                    "environment (states + observations)",
                    "backend",
                    "other",
                    "total traced",
                    "RSS growth",
                ],
                [
                    [
                        head["framework"],
                        head["environment"],
                        head["backend"],
                        head["other"],
                        sum(head.values()),
                        rss,
                    ]
                ],
            ),
            table(
                f"Bytes per active rollout vs trajectory length T ({p['sweep_rollouts']} rollouts)",
                [
                    "T",
                    "framework",
                    "environment",
                    "backend + other",
                    "total",
                    "framework bytes/step",
                    "total bytes/step",
                ],
                sweep_rows,
            ),
            table(
                "Fits of bytes per rollout: intercept + slope * T (+ curvature * T^2)",
                ["series", "intercept", "slope (bytes/step)", "R^2", "curvature (bytes/step^2)"],
                [
                    [name, f["intercept"], f["slope"], f["r2"], curvature(lengths, series[name])]
                    for name, f in fits.items()
                ],
            ),
        ],
        plots=[
            plot(
                "memory_vs_length.png",
                "Memory per active rollout vs trajectory length",
                "T (steps held)",
                "bytes per rollout",
                {
                    "total": list(zip(lengths, totals, strict=True)),
                    "framework": list(zip(lengths, framework, strict=True)),
                    "environment": [
                        (t, s["environment"]) for t, s in zip(lengths, sweep, strict=True)
                    ],
                },
            )
        ],
        notes=[
            "Measured inside the backend's generate call of the round after T steps: every "
            "rollout active, its requests built. gc.collect() before each snapshot.",
            "Attribution: the innermost llenvs_async frame among the 'frames' innermost of "
            "each allocation's traceback; llenvs_async/envs -> environment, "
            "llenvs_async/backends -> backend, other llenvs_async code -> framework; "
            "none -> other (asyncio machinery), counted with the framework in the target. "
            "Frames in llenvs_async/types.py and _history.py are skipped: a value is charged "
            "to the code that builds it (a state's history node to the environment's "
            "state.advance).",
            f"Framework: {fw['intercept']:.0f} B + {fw['slope']:.0f} B per step (fit), so "
            f"within {LIMIT_BYTES} B up to T = {(LIMIT_BYTES - fw['intercept']) / fw['slope']:.0f} "
            "steps. Per step: a Transition, an Action, two ChatMessages, two doubles of "
            "timing (a transition's info gets them when its trajectory is made) and the "
            "slots of the transition list and the conversation tuple.",
            f"Curvature of the total: {curvature(lengths, totals):.1f} B/step^2: a state "
            "links to its parent's history (State.actions is a persistent path, one node "
            "per step), so no state copies the prefix.",
        ],
        data={"headline": head, "rss_per_rollout": rss, "sweep": sweep, "fits": fits},
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main()
