"""Quickstart: batched rollouts on a pure env, a saved mid-trajectory state, V(s) and Q(s, a)."""

from __future__ import annotations

import asyncio
import random

from llenvs_async import (
    GenerationRequest,
    ScriptedBackend,
    TrajectoryRunner,
    estimate_q_values,
    estimate_values,
)
from llenvs_async.envs import ChainEnv


def policy(request: GenerationRequest) -> str:
    """A noisy walker: 'right' 70% of the time (seeded per rollout and step)."""
    rng = random.Random(f"{request.rollout_index}:{request.step}")
    return "right" if rng.random() < 0.7 else "left"


async def main() -> None:
    async with ChainEnv(max_steps=10) as env:  # corridors of length 3..7; reward 1 at the end
        runner = TrajectoryRunner(env, ScriptedBackend(policy))
        trajectories = await runner.run_batch([0, 1, 2, 3, 4])  # one lockstep batch
        print("success:", [t.success for t in trajectories])
        state = trajectories[4].states[2]  # a saved state carries its task and action prefix
        (v,) = await estimate_values(runner, [state], num_rollouts=40)
        right, left = await estimate_q_values(runner, state, ["right", "left"], num_rollouts=40)
        print(f"V(s)        = {v.mean:.2f}  95% CI [{v.ci_low:.2f}, {v.ci_high:.2f}]")
        print(f"Q(s, right) = {right.mean:.2f}  95% CI [{right.ci_low:.2f}, {right.ci_high:.2f}]")
        print(f"Q(s, left)  = {left.mean:.2f}  95% CI [{left.ci_low:.2f}, {left.ci_high:.2f}]")


if __name__ == "__main__":
    asyncio.run(main())
