"""An async training loop that really learns: REINFORCE on a tabular softmax policy.

The policy sits behind the ``Backend`` protocol like an LLM would: each ``generate``
returns a ``Completion`` with the sampled "token" id and its logprob. Each
iteration awaits one batch of rollouts on ``ChainEnv``, then takes policy-gradient
steps from the returns, weighting each step by exp(new logprob - recorded logprob)
(the recorded logprobs make the second epoch on the same batch off-policy-correct).

    python examples/training_loop.py
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Sequence

from llenvs_async import (
    Completion,
    GenerationRequest,
    SamplingParams,
    Trajectory,
    TrajectoryRunner,
)
from llenvs_async.envs import ChainEnv

ACTIONS = ("left", "right")
_POSITION = re.compile(r"You are at (\d+) of (\d+)")


class SoftmaxPolicy:
    """pi(a | position, length) = softmax(theta[position, length]); a Backend."""

    def __init__(self, seed: int) -> None:
        self.theta: dict[tuple[int, int], list[float]] = {}
        self.rng = random.Random(seed)

    def probs(self, key: tuple[int, int]) -> list[float]:
        logits = self.theta.setdefault(key, [0.0, 0.0])
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        return [w / sum(weights) for w in weights]

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        out = []
        for request in requests:
            p = self.probs(_key(request.messages[-1].content))
            a = 0 if self.rng.random() < p[0] else 1
            out.append(
                Completion(
                    text=ACTIONS[a],
                    token_ids=(a,),
                    logprobs=(math.log(p[a]),),
                    finish_reason="stop",
                )
            )
        return out

    async def aclose(self) -> None:
        return None

    def update(self, trajectories: Sequence[Trajectory], lr: float, gamma: float) -> None:
        """One policy-gradient step: (G_t - baseline) * ratio * grad log pi(a_t | s_t)."""
        baseline = _task_baselines(trajectories, gamma)
        grads: dict[tuple[int, int], list[float]] = {}
        for traj in trajectories:
            g = 0.0
            for t in reversed(traj.transitions):
                g = t.reward + gamma * g
                assert t.completion is not None and t.completion.logprobs is not None
                key, a = _key(t.state.observation.text), t.completion.token_ids[0]
                p = self.probs(key)
                ratio = math.exp(math.log(p[a]) - t.completion.logprobs[0])
                advantage = (g - baseline[traj.initial_state.task]) * min(ratio, 2.0)
                grad = grads.setdefault(key, [0.0, 0.0])
                for b in range(2):
                    grad[b] += advantage * ((1.0 if b == a else 0.0) - p[b])
        for key, grad in grads.items():
            for b in range(2):
                self.theta[key][b] += lr * grad[b] / len(trajectories)


def _key(observation: str) -> tuple[int, int]:
    match = _POSITION.search(observation)
    assert match is not None, observation
    return int(match[1]), int(match[2])


def _task_baselines(trajectories: Sequence[Trajectory], gamma: float) -> dict[object, float]:
    returns: dict[object, list[float]] = {}
    for traj in trajectories:
        returns.setdefault(traj.initial_state.task, []).append(traj.discounted_return(gamma))
    return {task: sum(r) / len(r) for task, r in returns.items()}


async def train(
    iterations: int = 15, rollouts_per_task: int = 8, seed: int = 0, verbose: bool = True
) -> list[float]:
    """Train and return the success rate of every iteration's batch."""
    policy = SoftmaxPolicy(seed)
    tasks = [task for task in range(5) for _ in range(rollouts_per_task)]
    history = []
    async with ChainEnv(max_steps=12) as env:
        runner = TrajectoryRunner(env, policy)
        for iteration in range(iterations):
            batch = await runner.run_batch(tasks)  # one lockstep batch, one generate per round
            rate = sum(t.success for t in batch) / len(batch)
            history.append(rate)
            if verbose:
                steps = sum(len(t) for t in batch) / len(batch)
                print(f"iteration {iteration:2d}  success {rate:5.1%}  mean steps {steps:4.1f}")
            for _ in range(2):  # two epochs per batch: the ratio corrects the second
                policy.update(batch, lr=4.0, gamma=0.95)
    return history


if __name__ == "__main__":
    rates = asyncio.run(train())
    print(f"success rate: {rates[0]:.0%} -> {rates[-1]:.0%}")
