"""Schedules side by side: async vs refill vs chunks on long-tailed environment steps.

256 rollouts of a few steps each; 80% of steps take 5 ms, 20% 50-500 ms (drawn once per
(rollout, step), so every schedule meets the same steps). The backend models an engine:
calls are served one at a time (one forward pass at a time) and cost a fixed part plus a
part per request. Lockstep rounds wait for their slowest step; the async schedule lets
each rollout generate as soon as its last step returned, coalescing requests that become
ready together into one call.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Sequence
from statistics import median
from typing import Any

from llenvs_async import (
    Action,
    Completion,
    GenerationRequest,
    Observation,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    TrajectoryRunner,
)
from llenvs_async._loop import run as run_on_loop
from llenvs_async.env import BaseEnvironment, new_episode_id
from llenvs_async.envs import CounterEnv

from ._common import Result, Target, bench_main, make_result, table
from ._workload import LatencyBackend
from .baselines import floor_lockstep

__all__ = ["EngineLikeBackend", "TailEnv", "main", "run", "step_latencies"]

FULL: dict[str, Any] = {
    "inputs": 256,
    "batch_size": 64,
    "steps": 4,
    "fast_s": 0.005,
    "slow_s": [0.05, 0.5],
    "slow_fraction": 0.2,
    "generate_base_s": 0.004,
    "generate_per_request_s": 0.0002,
    "repeats": 2,
    "cost_sizes": [256, 1024],
    "cost_steps": 4,
    "cost_repeats": 5,
}
QUICK: dict[str, Any] = {
    **FULL,
    "inputs": 16,
    "batch_size": 8,
    "steps": 3,
    "fast_s": 0.001,
    "slow_s": [0.01, 0.05],
    "repeats": 1,
    "cost_sizes": [8],
    "cost_repeats": 1,
}
SCHEDULES = ("async", "refill", "chunks")


def step_latencies(p: dict[str, Any], seed: int = 5) -> list[list[float]]:
    """Per rollout, per step: ``fast_s``, or with probability ``slow_fraction`` a draw
    from ``slow_s`` (uniform)."""
    rng = random.Random(seed)
    lo, hi = p["slow_s"]
    return [
        [
            rng.uniform(lo, hi) if rng.random() < p["slow_fraction"] else p["fast_s"]
            for _ in range(p["steps"])
        ]
        for _ in range(p["inputs"])
    ]


class TailEnv(BaseEnvironment):
    """Pure: task ``i``'s step ``k`` sleeps ``latencies[i][k]``; the episode ends after
    ``len(latencies[i])`` steps with reward 1."""

    pure_step = True

    def __init__(self, latencies: Sequence[Sequence[float]]) -> None:
        super().__init__(max_steps=None)
        self.latencies = latencies
        self.live = self.peak_live = 0  # episodes begun and not ended

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        assert isinstance(task, int)
        self.live += 1
        self.peak_live = max(self.peak_live, self.live)
        return State(observation=Observation(text=f"task {task}"), task=task,
                     episode_id=new_episode_id())  # fmt: skip

    async def _step(self, state: State, action: Action) -> StepResult:
        assert isinstance(state.task, int)
        steps = self.latencies[state.task]
        await asyncio.sleep(steps[state.step])
        done = state.step + 1 >= len(steps)
        self.live -= done
        next_state = state.advance(action, Observation(text="ok"), terminated=done)
        return StepResult.of(next_state, 1.0 if done else 0.0)


class EngineLikeBackend(ScriptedBackend):
    """One call at a time (a forward pass at a time), costing ``base + per_request * n``."""

    def __init__(self, base: float, per_request: float) -> None:
        super().__init__(lambda request: f"step {request.step}")
        self.base, self.per_request = base, per_request
        self._engine = asyncio.Lock()
        self.batch_sizes: list[int] = []

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        async with self._engine:
            self.batch_sizes.append(len(requests))
            await asyncio.sleep(self.base + self.per_request * len(requests))
            return await super().generate(requests, params)


async def _one(schedule: str, latencies: list[list[float]], p: dict[str, Any]) -> dict[str, Any]:
    backend = EngineLikeBackend(p["generate_base_s"], p["generate_per_request_s"])
    env = TailEnv(latencies)
    runner = TrajectoryRunner(env, backend)
    started = time.perf_counter()
    trajs = await runner.run_batch(
        list(range(p["inputs"])),
        batch_size=p["batch_size"],
        schedule=schedule,  # type: ignore[arg-type]
    )
    wall = time.perf_counter() - started
    assert all(t.success for t in trajs)
    return {
        "wall": wall,
        "generate_calls": runner.stats.generate_calls,
        "mean_batch": sum(backend.batch_sizes) / len(backend.batch_sizes),
        "peak_live": env.peak_live,
        "actions": [[a.text for a in t.actions] for t in trajs],
    }


async def _cpu_ours(schedule: str, size: int, steps: int) -> float:
    """CPU seconds of one zero-latency batch through the runner's multi-instance path."""

    async def factory() -> CounterEnv:
        return CounterEnv()

    runner = TrajectoryRunner(CounterEnv(), LatencyBackend(0.0), env_factory=factory)
    started = time.process_time()
    trajs = await runner.run_batch([steps - 1] * size, schedule=schedule)  # type: ignore[arg-type]
    cpu = time.process_time() - started
    assert all(t.success and len(t) == steps for t in trajs)
    return cpu


async def _cpu_floor(size: int, steps: int) -> float:
    """The same batch through a bare asyncio.gather lockstep loop (benchmarks.baselines)."""
    envs = [CounterEnv() for _ in range(size)]
    started = time.process_time()
    finals = await floor_lockstep(envs, LatencyBackend(0.0), steps - 1)
    cpu = time.process_time() - started
    assert all(s.terminated and s.step == steps for s in finals)
    return cpu


def step_cost(p: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Microseconds of CPU per rollout-step (min over repeats), per size and side. CPU
    time, not wall: on a shared machine other processes' load barely moves it."""
    out: dict[int, dict[str, float]] = {}
    steps = p["cost_steps"]
    for size in p["cost_sizes"]:
        runs: dict[str, list[float]] = {"floor": [], "refill": [], "async": []}
        run_on_loop(_cpu_ours("async", size, steps))  # warm-up
        for _ in range(p["cost_repeats"]):
            for side in runs:  # interleaved
                gc.collect()
                coro = _cpu_floor(size, steps) if side == "floor" else _cpu_ours(side, size, steps)
                runs[side].append(run_on_loop(coro))
        out[size] = {side: 1e6 * min(v) / (size * steps) for side, v in runs.items()}
    return out


def run(quick: bool = False) -> Result:
    p = QUICK if quick else FULL
    latencies = step_latencies(p)
    samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SCHEDULES}
    for _ in range(p["repeats"]):
        for schedule in SCHEDULES:  # interleaved: noise hits all alike
            samples[schedule].append(run_on_loop(_one(schedule, latencies, p)))
    ratio = median(
        a["wall"] / r["wall"] for a, r in zip(samples["async"], samples["refill"], strict=True)
    )
    same = all(x["actions"] == samples["refill"][0]["actions"] for s in samples.values() for x in s)
    for runs in samples.values():
        for x in runs:
            del x["actions"]  # identical across schedules (checked): not worth the JSON
    rows = [
        [
            s,
            median(x["wall"] for x in samples[s]),
            median(x["generate_calls"] for x in samples[s]),
            median(x["mean_batch"] for x in samples[s]),
            max(x["peak_live"] for x in samples[s]),
        ]
        for s in SCHEDULES
    ]
    slowest_sum = sum(max(steps) for steps in latencies)
    cost = step_cost(p)
    cost_targets = [
        Target(
            f"CPU per rollout-step above the floor, {side}, B={size}",
            us[side] - us["floor"],
            15.0,
            "<=",
            "us",
            "min over repeats, same run",
        )
        for size, us in cost.items()
        for side in ("refill", "async")
    ]
    return make_result(
        "schedule",
        params=p,
        targets=[
            Target("async wall / refill wall", ratio, 0.6, "<=", "x", "median of ratios"),
            Target(
                "identical trajectories across schedules",
                1.0 if same else 0.0,
                1.0,
                ">=",
                "",
                "1 when async, refill and chunks took the same actions",
            ),
            Target(
                "live rollouts high-water (async)",
                max(x["peak_live"] for x in samples["async"]),
                p["batch_size"],
                "<=",
                "",
                "episodes begun and not ended, counted by the env",
            ),
            *cost_targets,
        ],
        tables=[
            table(
                f"{p['inputs']} rollouts x {p['steps']} steps, batch_size {p['batch_size']}; "
                f"steps {p['fast_s'] * 1e3:.0f} ms, {p['slow_fraction']:.0%} of them "
                f"{p['slow_s'][0] * 1e3:.0f}-{p['slow_s'][1] * 1e3:.0f} ms",
                ["schedule", "wall s", "generate calls", "mean batch per call", "peak live"],
                rows,
            ),
            table(
                f"Framework cost: CPU us per rollout-step, zero latency, {p['cost_steps']} steps "
                "per rollout, multi-instance path (one CounterEnv per rollout)",
                ["B", "asyncio floor", "refill", "async", "refill - floor", "async - floor"],
                [
                    [
                        b,
                        us["floor"],
                        us["refill"],
                        us["async"],
                        us["refill"] - us["floor"],
                        us["async"] - us["floor"],
                    ]
                    for b, us in cost.items()
                ],
            ),
        ],
        notes=[
            f"Engine model: calls served one at a time, each {p['generate_base_s'] * 1e3:g} ms "
            f"+ {p['generate_per_request_s'] * 1e3:g} ms per request.",
            f"A lockstep round lasts as long as its slowest member's step: with "
            f"{p['batch_size']} rollouts live nearly every round holds a slow step "
            f"(sum of the slowest step of each rollout: {slowest_sum:.1f} s).",
            "Framework cost: CPU time (time.process_time) of the whole batch, factory, "
            "restore and teardown included, divided by rollout-steps; the floor is "
            "benchmarks.baselines.floor_lockstep on the same CounterEnv and backend.",
        ],
        data={"samples": samples, "step_cost_us": {str(b): us for b, us in cost.items()}},
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main()
