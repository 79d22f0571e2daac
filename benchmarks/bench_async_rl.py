"""Wall time per RL training step: overlapped (stream + in-flight weight updates) vs
synchronous alternation (generate a batch, train, update), same model, work and code.

Both sides run ``examples/train_tiny_rl.py``'s ``train`` (GRPO, the tiny model on the real
vLLM CPU engine, torch on CPU) from the same warmed-up weights: ``overlap=True`` consumes
groups from ``runner.stream(max_staleness=1)`` while rollouts keep running and pushes each
step's weights with ``mode="keep"``; ``overlap=False`` awaits ``run_batch`` and then pushes
with ``mode="wait"``. Runs alternate (sync, overlap, sync, ...) so drift in the shared
machine's load hits both. Also reports the staleness the trainer actually saw.

``python -m benchmarks.bench_async_rl [--quick]`` (needs ``make vllm``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import Result, Target, bench_main, make_result, table

__all__ = ["main", "run"]

FULL: dict[str, Any] = {"steps": 12, "repeats": 2, "eval_episodes": 16}
QUICK: dict[str, Any] = {"steps": 2, "repeats": 1, "eval_episodes": 4}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_tiny_rl.py"
SIDES = ("synchronous", "overlapped")


def load_trainer() -> Any:
    """The example script as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location("train_tiny_rl", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def per_step(seconds: Sequence[float]) -> float:
    """Mean seconds per step after the first (which also fills the pipeline)."""
    gaps = [b - a for a, b in itertools.pairwise(seconds)]
    return statistics.fmean(gaps) if gaps else seconds[0]


async def _measure(config: dict[str, Any]) -> dict[str, Any]:
    from llenvs_async.testing.tiny_model import cached_tiny_model

    trainer = load_trainer()
    model_dir = str(cached_tiny_model())
    cfg = trainer.Config(steps=config["steps"], eval_episodes=config["eval_episodes"])
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    async with trainer.engine_backend(model_dir) as backend:
        for _ in range(config["repeats"]):
            for side in SIDES:
                result = await trainer.train(
                    "grpo", cfg, backend, model_dir, overlap=side == "overlapped", verbose=False
                )
                seconds = [s.seconds for s in result.steps]
                runs[side].append({
                    "step_s": per_step(seconds),
                    "total_s": seconds[-1],
                    "staleness": [s.staleness for s in result.steps],
                    "mixed_version_batches": sum(len(s.versions) > 1 for s in result.steps),
                    "discarded_stale": result.discarded_stale,
                    "success_before": result.before,
                    "success_after": result.after,
                    "rollouts": result.steps[-1].rollouts,
                    "phases": {
                        k: statistics.fmean(st.phases[k] for st in result.steps[1:] or result.steps)
                        for k in ("rollouts", "train", "update")
                    },
                })  # fmt: skip
    return {
        "runs": runs,
        "max_staleness": cfg.max_staleness,
        "batch": cfg.group_size * cfg.groups_per_step,
    }


def run(quick: bool) -> Result:
    config = QUICK if quick else FULL
    data = asyncio.run(_measure(config))
    runs = data["runs"]
    step = {side: statistics.median(r["step_s"] for r in runs[side]) for side in SIDES}
    ratio = step["synchronous"] / step["overlapped"]
    seen = max(max(r["staleness"]) for r in runs["overlapped"])
    phase = {
        k: statistics.median(r["phases"][k] for r in runs["synchronous"])
        for k in ("rollouts", "train", "update")
    }
    # Perfect overlap hides the shorter of generating and training behind the longer.
    ideal = sum(phase.values()) / (max(phase["rollouts"], phase["train"]) + phase["update"])
    rows = [
        [
            side,
            round(step[side], 3),
            round(statistics.median(r["total_s"] for r in runs[side]), 2),
            max(max(r["staleness"]) for r in runs[side]),
            round(statistics.fmean(s for r in runs[side] for s in r["staleness"]), 2),
            sum(r["mixed_version_batches"] for r in runs[side]),
            sum(r["discarded_stale"] for r in runs[side]),
            *(
                round(statistics.median(r["phases"][k] for r in runs[side]), 3)
                for k in ("rollouts", "train", "update")
            ),
            " ".join(f"{r['success_before']:.2f}->{r['success_after']:.2f}" for r in runs[side]),
        ]
        for side in SIDES
    ]
    data["ideal_ratio"] = ideal
    return make_result(
        "async_rl",
        params={**config, "batch": data["batch"], "max_staleness": data["max_staleness"]},
        tables=[
            table(
                f"Seconds per training step (GRPO, {data['batch']} rollouts a step, median of "
                f"{config['repeats']} runs of {config['steps']} steps)",
                [
                    "loop",
                    "s / step",
                    "total s",
                    "max staleness",
                    "mean staleness",
                    "batches with 2 versions",
                    "stale groups rerun",
                    "waiting for rollouts s",
                    "train s",
                    "update_weights s",
                    "success before->after",
                ],
                rows,
            )
        ],
        targets=[
            Target(
                name="synchronous / overlapped seconds per step",
                value=round(ratio, 3),
                limit=1.0,
                op=">=",
                basis="same model, batch, estimator and code; runs alternate",
            ),
            Target(
                name="max staleness observed (overlapped)",
                value=seen,
                limit=data["max_staleness"],
                op="<=",
                unit="versions",
                basis="backend version at consumption - oldest version of the batch",
            ),
        ],
        notes=[
            f"ideal ratio from the synchronous phases (perfect overlap of generating and "
            f"training, same per-phase cost): {ideal:.2f}; measured {ratio:.2f}. On these 2 "
            f"shared cores the engine and the trainer compete for CPU, so training slows when "
            f"it overlaps generation; on a GPU the engine runs on its own device",
            "staleness = trainer's version when it consumed the batch minus the oldest "
            "version that sampled any of its actions; synchronous is 0 by construction",
        ],
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":  # vLLM starts its engine core with spawn: keep this guard
    main()
