"""``examples/train_agent_rl.py``: its Monte Carlo advantages, and a short real run.

The advantage tests would fail with V = 0, a flipped sign or an off-by-one step: they check
``A_t = r_t + V(s_{t+1}) - V(s_t)`` on hand-set values, and on values ``estimate_values``
measured for a pure corridor game where an early wasted move is irrecoverable. The run test
drives the real loop (vLLM CPU engine, Harbor tasks in Docker) and asserts improvement.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType

import pytest

from llenvs_async import Action, Observation, SamplingParams, State, Trajectory, TrajectoryRunner
from llenvs_async.backends.scripted import ScriptedBackend
from llenvs_async.envs import ChainEnv
from llenvs_async.types import Completion, GenerationRequest, Transition
from tests.engine.conftest import vllm_ready  # noqa: F401  (a fixture: skip, or fail in CI)

from .conftest import load_example, run_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("train_agent_rl.py")


def _trajectory(task: int, rewards: list[float]) -> tuple[Trajectory, list[State]]:
    """An episode of ``len(rewards)`` generated steps whose states are all distinct."""
    states = [State(observation=Observation(text="s0"), task=task)]
    transitions = []
    for i, reward in enumerate(rewards):
        done = i == len(rewards) - 1
        action = Action(text=f"a{i}")
        nxt = states[-1].advance(action, Observation(text=f"s{i + 1}"), terminated=done)
        transitions.append(
            Transition(state=states[-1], action=action, next_state=nxt, reward=reward,
                       completion=Completion(text=f"a{i}"))
        )  # fmt: skip
        states.append(nxt)
    traj = Trajectory(episode_id="e", initial_state=states[0], transitions=tuple(transitions))
    return traj, states


def test_vine_samples_are_td_errors_of_the_given_values(example: ModuleType) -> None:
    traj, states = _trajectory(task=0, rewards=[0.0, 0.0, 1.0])
    values = {0.2: states[0], 0.5: states[1], 0.9: states[2]}
    value = {example.state_key(s): v for v, s in values.items()}
    assert set(example.live_states([traj])) == set(value)  # the done state is not estimated
    got = [a for _, a in example.vine_samples([traj], value)]
    # V = 0 gives [0, 0, 1]; a flipped sign [-0.3, -0.4, -0.1]; V(s_{t+1}) shifted by one
    # step [0.7, -0.5, 0.1]; the reward of the next step [0.3, 1.4, 0.1]: none of these.
    assert got == pytest.approx([0.3, 0.4, 0.1])


async def _run(policy: Callable[[GenerationRequest], str], tasks: list[int]) -> list[Trajectory]:
    env = ChainEnv(min_length=3, num_tasks=1, max_steps=3)
    async with env, ScriptedBackend(policy) as backend:
        return await TrajectoryRunner(env, backend, SamplingParams()).run_batch(tasks)


async def test_vine_advantages_blame_the_irrecoverable_first_move(example: ModuleType) -> None:
    # Corridor of 3 in 3 steps: a wasted first move ("left" at 0) can never reach the goal.
    wasted = await _run(lambda r: "left" if r.step == 0 else "right", [0])
    straight = await _run(lambda r: "right", [0])
    assert [t.success for t in wasted + straight] == [False, True]
    env = ChainEnv(min_length=3, num_tasks=1, max_steps=3)
    async with env, ScriptedBackend(lambda r: "right") as backend:  # V under "always right"
        runner = TrajectoryRunner(env, backend, SamplingParams())
        samples, spent = await example.vine_advantages(runner, wasted + straight, rollouts=2)
    # live states: start; after left (0 at step 1), then 1 at step 2; after right 1, then 2
    assert spent == 5 * 2
    advantages = [a for _, a in samples]
    assert advantages[:3] == pytest.approx([-1.0, 0.0, 0.0])  # the first move takes the blame
    assert advantages[3:] == pytest.approx([0.0, 0.0, 0.0])  # on track: nothing to credit


def test_grpo_advantages_are_normalised_within_the_group(example: ModuleType) -> None:
    won, _ = _trajectory(task=0, rewards=[0.0, 1.0])
    lost, _ = _trajectory(task=0, rewards=[0.0, 0.0])
    got = [a for _, a in example.grpo_advantages([won, lost])]
    assert got == pytest.approx([1.0, 1.0, -1.0, -1.0], abs=1e-3)


_STEP = re.compile(
    r"^\[(\w+) seed \d+\] step +\d+ +success [\d.]+ +staleness (\d+) .* rollouts +\d+ +"
    r"format-errors ([\d.]+)"
)
_FINAL = re.compile(r"^held-out success \((\w+)\): ([\d.]+) -> ([\d.]+)$")


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.timeout(1500)
@pytest.mark.xfail(
    strict=True,
    reason="measured 2026-12-03: the policy collapses to format errors under RL (lr 3e-4)",
)
def test_quick_run_improves_held_out_success(vllm_ready: str, docker_ready: None) -> None:  # noqa: F811
    example = load_example("train_agent_rl.py")
    cfg = example.Config.quick()
    out = run_example("train_agent_rl.py", "--quick", "--estimator", "both", timeout=1400).stdout
    steps: dict[str, list[int]] = {"grpo": [], "vine": []}
    final = {}
    for line in out.splitlines():
        if m := _STEP.match(line):
            steps[m[1]].append(int(m[2]))
        elif m := _FINAL.match(line):
            final[m[1]] = (float(m[2]), float(m[3]))
    assert set(final) == {"grpo", "vine"}, out
    for staleness in steps.values():
        assert len(staleness) == cfg.steps, out
        assert max(staleness) <= cfg.max_staleness, out
    assert max(after - before for before, after in final.values()) >= 0.3, final
