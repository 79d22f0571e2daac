from __future__ import annotations

import math
import random

import pytest

from llenvs_async import (
    Action,
    GenerationRequest,
    ScriptedBackend,
    TrajectoryRunner,
    estimate_q_values,
    estimate_values,
)
from llenvs_async.envs import ChainEnv, CounterEnv
from llenvs_async.estimation import summarize_returns


def test_summary_statistics() -> None:
    est = summarize_returns([1.0, 0.0, 1.0, 1.0])
    assert est.mean == 0.75 and est.n == 4
    assert est.stderr == pytest.approx(math.sqrt(0.25 / 4))
    assert est.ci_low == pytest.approx(0.75 - 3.182 * est.stderr)
    assert est.ci == (est.ci_low, est.ci_high)
    empty = summarize_returns([], failed=3)
    assert empty.n == 0 and empty.failed == 3 and math.isnan(empty.mean)
    assert math.isinf(summarize_returns([1.0]).stderr)


async def test_q_values_separate_a_good_and_a_bad_first_action() -> None:
    rng = random.Random(0)

    def noisy(request: GenerationRequest) -> str:  # mostly right, sometimes left
        return "right" if rng.random() < 0.8 else "left"

    env = ChainEnv(min_length=3, max_steps=3)
    start = await env.reset(0)
    runner = TrajectoryRunner(environment=env, backend=ScriptedBackend(noisy))
    good, bad = await estimate_q_values(runner, start, ["right", Action(text="left")], 40)
    assert good.n == bad.n == 40 and good.action == Action(text="right")
    # after "left" (still at 0) the goal 3 steps away is out of reach in 2 steps
    assert bad.mean == 0.0 and good.mean > 0.3
    assert not good.overlaps(bad)


async def test_values_count_failed_rollouts_apart() -> None:
    def policy(request: GenerationRequest) -> str:
        return "boom" if request.rollout_index % 4 == 0 else "submit"

    async def factory() -> CounterEnv:
        return CounterEnv(fail_on="boom")

    main = CounterEnv()
    s = await main.reset(0)
    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(policy), env_factory=factory
    )
    [v] = await estimate_values(runner, [s], num_rollouts=8, batch_size=4)
    assert v.failed == 2 and v.n == 6 and v.mean == 1.0


async def test_bad_arguments() -> None:
    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(lambda r: "x"))
    s = await ChainEnv().reset(0)
    with pytest.raises(ValueError, match="num_rollouts"):
        await estimate_values(runner, [s], num_rollouts=0)
    with pytest.raises(ValueError, match="gamma"):
        await estimate_values(runner, [s], num_rollouts=1, gamma=2.0)
    with pytest.raises(ValueError, match="actions is empty"):
        await estimate_q_values(runner, s, [], num_rollouts=1)
