"""Per-request seeds: rollouts from one state are independent samples, reproducible by base seed."""

from __future__ import annotations

import random

import pytest

from llenvs_async import GenerationRequest, SamplingParams, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import ChainEnv
from llenvs_async.runner._rollout import request_seed


def _sampling_policy(seen: list[int | None]):  # type: ignore[no-untyped-def]
    """A stochastic policy that draws its action from ``request.seed`` (as an engine would)."""

    def policy(request: GenerationRequest) -> str:
        seen.append(request.seed)
        return random.Random(request.seed).choice(["left", "right"])

    return policy


async def _sixteen_from_one_state(base_seed: int | None) -> tuple[list[tuple[str, ...]], list]:  # type: ignore[type-arg]
    env = ChainEnv(num_tasks=1, max_steps=6)
    state = await env.reset(0)
    seen: list[int | None] = []
    runner = TrajectoryRunner(
        env, ScriptedBackend(_sampling_policy(seen)), SamplingParams(seed=base_seed)
    )
    trajs = await runner.run_batch_from_states([state] * 16)
    return [tuple(a.text for a in t.actions) for t in trajs], seen


async def test_rollouts_from_one_state_get_distinct_seeds_and_differ() -> None:
    paths, seen = await _sixteen_from_one_state(base_seed=7)
    assert len(set(paths)) > 1, "16 rollouts from one state must not all be identical"
    assert None not in seen and len(set(seen)) == len(seen)  # one seed per request


async def test_the_same_base_seed_reproduces_the_rollouts_exactly() -> None:
    first, seeds_a = await _sixteen_from_one_state(base_seed=7)
    again, seeds_b = await _sixteen_from_one_state(base_seed=7)
    other, _ = await _sixteen_from_one_state(base_seed=8)
    assert first == again and seeds_a == seeds_b
    assert other != first


async def test_no_base_seed_leaves_sampling_to_the_engine() -> None:
    _, seen = await _sixteen_from_one_state(base_seed=None)
    assert seen and all(s is None for s in seen)


def test_request_seed_is_stable_and_fits_int64() -> None:
    assert request_seed(0, "t", 3, 2) == request_seed(0, "t", 3, 2)
    seeds = {
        request_seed(0, t, i, s) for t in (0, "0", None) for i in range(100) for s in range(10)
    }
    assert len(seeds) == 3000 and all(0 <= s < 2**63 for s in seeds if s is not None)
    assert request_seed(None, 0, 1, 1) is None


async def _chain_paths(
    tasks: list[int], ids: list[int] | None, base_seed: int = 5
) -> list[tuple[str, ...]]:
    env = ChainEnv(num_tasks=3, max_steps=6)
    runner = TrajectoryRunner(
        env, ScriptedBackend(_sampling_policy([])), SamplingParams(seed=base_seed)
    )
    trajs = await runner.run_batch(tasks, batch_size=2, rollout_ids=ids)
    return [tuple(a.text for a in t.actions) for t in trajs]


async def test_rollout_ids_keep_each_rollouts_draws_when_others_are_left_out() -> None:
    # Four rollouts of each of three tasks, numbered 0-3 within their task; then a run of
    # only some of them (as a resumed run is): each keeps the draws it had in the full run.
    keys = [(t, r) for t in range(3) for r in range(4)]
    full = await _chain_paths([t for t, _ in keys], [r for _, r in keys])
    assert len(set(full)) > 3
    left = [k for i, k in enumerate(keys) if i % 3 != 1]
    part = await _chain_paths([t for t, _ in left], [r for _, r in left])
    assert part == [full[keys.index(k)] for k in left]
    # By position instead (no ids), the same subset draws other actions.
    by_position = await _chain_paths([t for t, _ in left], None)
    assert by_position != part


async def test_rollout_ids_are_checked() -> None:
    env = ChainEnv(num_tasks=1, max_steps=2)
    runner = TrajectoryRunner(env, ScriptedBackend(lambda r: "right"), SamplingParams())
    with pytest.raises(ValueError, match="rollout_ids has 1 items but tasks has 2"):
        await runner.run_batch([0, 0], rollout_ids=[0])
    state = await env.reset(0)
    with pytest.raises(TypeError, match=r"rollout_ids\[1\] must be an int, got str '1'"):
        await runner.run_batch_from_states([state, state], rollout_ids=[0, "1"])  # type: ignore[list-item]
