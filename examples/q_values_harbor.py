"""The multi-instance recipe end to end: Harbor tasks in containers, Q(s, a) by forced actions.

Follows the original design (seed/multi-instance-runner): a primary environment
for collection, an ``env_factory`` for one fresh instance per rollout,
``harbor_restore`` to bring each instance to a saved state by replay, then
``run_batch_from_state_actions`` (first action forced) for Q(s, a); finally
``validate_replay_consistency`` says whether replay is trustworthy for a task.

    python examples/q_values_harbor.py        # needs Docker and the base image
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from llenvs_async import (
    Action,
    Environment,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async.adapters.harbor import (
    HarborAdapter,
    harbor_oracle,
    harbor_restore,
    validate_replay_consistency,
)

TASKS = Path(__file__).resolve().parent / "tasks"
NUM_ROLLOUTS = 6


async def main() -> None:
    async with HarborAdapter() as adapter:  # closing it closes its Docker client
        await collect_and_estimate(adapter)


async def collect_and_estimate(adapter: HarborAdapter) -> None:
    dataset = await adapter.get_dataset(TASKS)

    def solution(task: int | str | None) -> Sequence[str]:
        return dataset.resolve(task)[1].solution_commands()

    # Primary env for trajectory collection; the factory makes fresh, independent instances.
    env = await adapter.get_environment(TASKS, max_steps=30)

    async def env_factory() -> Environment:
        return await adapter.get_environment(TASKS, max_steps=30)

    backend = ScriptedBackend(harbor_oracle(solution, epsilon=0.1, seed=3))
    runner = TrajectoryRunner(
        environment=env,
        backend=backend,
        sampling_params=SamplingParams(temperature=0.0),
        env_factory=env_factory,
        restore_fn=harbor_restore,
        # a rollout from a restored state sees the conversation the saved state carries
    )
    async with env, backend:
        (trajectory,) = await runner.run_batch(["json-config"])
        saved_state = trajectory.states[1]  # after the first command: a mid-trajectory state
        print(f"collected: {len(trajectory)} steps, reward {trajectory.total_reward}")
        prefix = [a.text[:40] for a in saved_state.actions]
        print(f"saved state: step {saved_state.step}, prefix {prefix}")

        # Q(s, a): force the first action, then let the policy continue; at most 4 containers.
        for candidate in (solution("json-config")[1], "rm -f /app/config.json"):
            trajectories = await runner.run_batch_from_state_actions(
                states=[saved_state] * NUM_ROLLOUTS,
                actions=[Action(text=candidate)] * NUM_ROLLOUTS,
                batch_size=4,
            )
            returns = [t.total_reward for t in trajectories if t.error is None]
            print(
                f"Q(s, {candidate[:40]!r}) = {sum(returns) / len(returns):.2f} (n={len(returns)})"
            )
        print(f"peak live containers: {runner.stats.peak_live_instances}")

    # Is replay trustworthy? Deterministic commands replay identically; $RANDOM/date do not.
    for name in ("json-config", "random-session"):
        result = await validate_replay_consistency(
            env_factory=env_factory,
            task_index=dataset.index_of(name),
            trajectory=solution(name),
            probe_commands=("cd /app && find . -type f | sort | xargs md5sum",),
            num_trials=3,
        )
        print(f"replay of {name}: consistent={result['consistent']}")


if __name__ == "__main__":
    asyncio.run(main())
