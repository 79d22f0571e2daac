from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llenvs_async import (
    Action,
    EstimationError,
    GenerationRequest,
    RolloutsFailedError,
    SamplingParams,
    ScriptedBackend,
    State,
    TrajectoryRunner,
    estimate_q_values,
    estimate_values,
)
from llenvs_async.envs import ArithmeticEnv, ChainEnv, CounterEnv
from llenvs_async.estimation import summarize_returns


def test_summary_statistics_with_an_unbounded_range_use_student_t() -> None:
    est = summarize_returns([1.0, 0.0, 1.0, 1.0], reward_range=(-math.inf, math.inf))
    assert est.mean == 0.75 and est.n == 4 and est.method == "student-t"
    assert est.stderr == pytest.approx(math.sqrt(0.25 / 4))
    assert est.ci_low == pytest.approx(0.75 - 3.182 * est.stderr)
    assert est.ci == (est.ci_low, est.ci_high)
    assert math.isinf(summarize_returns([1.0], reward_range=(-math.inf, math.inf)).stderr)
    # a half-bounded range clips the t interval at its finite end
    clipped = summarize_returns([0.0, 0.0, 1.0], reward_range=(0.0, math.inf))
    assert clipped.ci_low == 0.0 and clipped.ci_high > 1.0


def test_no_returns_give_the_whole_range() -> None:
    empty = summarize_returns([], reward_range=(0.0, 1.0), failed=3)
    assert empty.n == 0 and empty.failed == 3 and math.isnan(empty.mean)
    assert empty.ci == (0.0, 1.0) and empty.method == "none"
    unbounded = summarize_returns([], reward_range=(-math.inf, math.inf))
    assert math.isnan(unbounded.ci_low) and math.isnan(unbounded.ci_high)


def test_the_method_follows_the_returns() -> None:
    binary = summarize_returns([1.0, 0.0, 1.0], reward_range=(0.0, 1.0))
    general = summarize_returns([1.0, 0.5, 1.0], reward_range=(0.0, 1.0))
    assert binary.method == "wilson" and general.method == "betting"
    assert binary.reward_range == general.reward_range == (0.0, 1.0)
    # float sums a rounding away from a bound count as on it
    assert summarize_returns([0.1 + 0.2 + 0.7], reward_range=(0.0, 1.0)).method == "wilson"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
    st.sampled_from([(0.0, 1.0), (-5.0, 2.0), (10.0, 10.5)]),
)
def test_any_bounded_returns_get_a_nonzero_interval_inside_the_range(
    unit: list[float], reward_range: tuple[float, float]
) -> None:
    lo, hi = reward_range
    returns = [lo + (hi - lo) * u for u in unit]
    e = summarize_returns(returns, reward_range=reward_range)
    assert lo <= e.ci_low <= e.mean <= e.ci_high <= hi
    assert e.ci_high > e.ci_low and e.method in ("wilson", "betting")


def test_returns_outside_the_range_are_an_error() -> None:
    with pytest.raises(EstimationError, match=r"return 1\.5 of rollout 1 is outside") as info:
        summarize_returns([1.0, 1.5], reward_range=(0.0, 1.0))
    assert info.value.details["value"] == 1.5
    for bad in ((1.0, 0.0), (0.0, 0.0), (0.0, math.nan), "01", (0.0,)):
        with pytest.raises(ValueError, match="reward_range must be"):
            summarize_returns([0.0], reward_range=bad)  # type: ignore[arg-type]


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


async def _failing_runner() -> tuple[TrajectoryRunner, State]:
    """Rollouts 0 and 4 of each 8 fail (their environment raises on "boom"); the rest get 1."""

    def policy(request: GenerationRequest) -> str:
        return "boom" if request.rollout_index % 4 == 0 else "submit"

    async def factory() -> CounterEnv:
        return CounterEnv(fail_on="boom")

    main = CounterEnv()
    s = await main.reset(0)
    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(policy), env_factory=factory
    )
    return runner, s


async def test_failures_exclude_counts_failed_rollouts_apart() -> None:
    runner, s = await _failing_runner()
    [v] = await estimate_values(runner, [s], num_rollouts=8, batch_size=4)
    assert v.failed == 2 and v.n == 6 and v.mean == 1.0 and len(v.returns) == 6
    assert v.method == "wilson" and v.reward_range == (0.0, 1.0)  # CounterEnv's range


async def test_failures_zero_counts_a_failed_rollout_as_return_zero() -> None:
    runner, s = await _failing_runner()
    [v] = await estimate_values(runner, [s], 8, 4, failures="zero")
    assert v.failed == 2 and v.n == 8 and v.mean == 0.75
    assert sorted(v.returns) == [0.0, 0.0] + [1.0] * 6
    with pytest.raises(ValueError, match=r"failures='zero'.*outside reward_range"):
        await estimate_values(runner, [s], 8, failures="zero", reward_range=(0.5, 1.0))


async def test_failures_raise_names_the_count_and_the_first_error() -> None:
    runner, s = await _failing_runner()
    with pytest.raises(RolloutsFailedError, match=r"4 of 8 rollouts failed.*rollout 0: EnvError"):
        await estimate_q_values(runner, s, ["boom", "submit"], 4, failures="raise")
    with pytest.raises(RolloutsFailedError) as info:
        await estimate_values(runner, [s], 8, 4, failures="raise")
    err = info.value
    assert err.failed == 2 and err.total == 8 and len(err.trajectories) == 8
    assert err.first_error.type == "EnvError" and "boom" in err.first_error.message
    assert isinstance(err, EstimationError)
    # nothing failed: no error
    [ok] = await estimate_q_values(runner, s, ["submit"], 3, failures="raise")
    assert ok.n == 3 and ok.failed == 0


async def test_reward_range_defaults_to_the_environments_attribute() -> None:
    env = ArithmeticEnv()
    s = await env.reset(0)
    runner = TrajectoryRunner(env, ScriptedBackend(lambda r: "no idea"))
    [v] = await estimate_values(runner, [s], 4)
    assert v.reward_range == ArithmeticEnv.reward_range and v.mean == 0.0
    assert v.ci_low == 0.0 and v.ci_high > 0.3  # 0 of 4: not a zero-width [0, 0]
    [w] = await estimate_values(runner, [s], 4, reward_range=(-1.0, 1.0))
    assert w.reward_range == (-1.0, 1.0) and w.method == "betting"  # 0 is not a bound here


async def test_an_unknown_reward_range_is_an_error_before_any_rollout() -> None:
    class Unbounded(ChainEnv):
        reward_range = None  # type: ignore[assignment]

    backend = ScriptedBackend(lambda r: "right")
    env = Unbounded()
    runner = TrajectoryRunner(env, backend)
    s = await env.reset(0)
    with pytest.raises(EstimationError, match="Unbounded declares no reward_range"):
        await estimate_values(runner, [s], 2)
    assert backend.calls == 0
    [v] = await estimate_values(runner, [s], 2, reward_range=(-math.inf, math.inf))
    assert v.method == "student-t"


async def test_a_declared_range_the_returns_break_is_an_error() -> None:
    env = ChainEnv(min_length=1, max_steps=1)
    s = await env.reset(0)
    runner = TrajectoryRunner(env, ScriptedBackend(lambda r: "right"))
    with pytest.raises(EstimationError, match=r"return 1\.0 of rollout 0 is outside"):
        await estimate_values(runner, [s], 2, reward_range=(0.0, 0.5))


async def test_bad_arguments() -> None:
    runner = TrajectoryRunner(environment=ChainEnv(), backend=ScriptedBackend(lambda r: "x"))
    s = await ChainEnv().reset(0)
    with pytest.raises(ValueError, match="num_rollouts"):
        await estimate_values(runner, [s], num_rollouts=0)
    with pytest.raises(ValueError, match="gamma"):
        await estimate_values(runner, [s], num_rollouts=1, gamma=2.0)
    with pytest.raises(ValueError, match="actions is empty"):
        await estimate_q_values(runner, s, [], num_rollouts=1)
    with pytest.raises(ValueError, match="failures must be one of"):
        await estimate_values(runner, [s], 1, failures="drop")  # type: ignore[arg-type]
    env = ChainEnv()
    env.reward_range = (1.0, 0.0)
    backwards = TrajectoryRunner(env, ScriptedBackend(lambda r: "x"))
    with pytest.raises(ValueError, match=r"ChainEnv\.reward_range must be"):
        await estimate_values(backwards, [s], 1)


async def test_an_estimate_keeps_the_rollouts_it_was_computed_from() -> None:
    runner, s = await _failing_runner()
    [v] = await estimate_values(runner, [s], num_rollouts=8, batch_size=4)
    assert len(v.trajectories) == v.n + v.failed == 8
    assert sum(t.error is not None for t in v.trajectories) == v.failed == 2
    assert all(t.initial_state.task == s.task and t.initial_state.step == s.step == 0
               for t in v.trajectories)  # fmt: skip
    ok = [t.discounted_return() for t in v.trajectories if t.error is None]
    assert tuple(ok) == v.returns  # in order: returns[i] is the i-th rollout that did not fail
    boom, submit = await estimate_q_values(runner, s, ["boom", "submit"], 3, failures="zero")
    assert [len(boom.trajectories), len(submit.trajectories)] == [boom.n, submit.n] == [3, 3]
    assert all(t.error is not None and "'boom'" in t.error.message for t in boom.trajectories)
    assert boom.failed == 3 and submit.failed == 0
    assert all(t.actions[0].text == "submit" for t in submit.trajectories)
    # not part of the value: equal estimates from other rollouts compare equal
    assert submit == summarize_returns(submit.returns, reward_range=(0.0, 1.0), state=s,
                                       action=Action(text="submit"))  # fmt: skip
    assert "trajectories" not in repr(submit)


async def test_numbering_the_rollouts_on_draws_fresh_samples_and_repeating_repeats() -> None:
    """Seeds follow the rollout number: the same numbers repeat a call's draws exactly
    (reproducible), numbers further on give independent ones; Q estimates alike."""

    def policy(request: GenerationRequest) -> str:
        return random.Random(request.seed).choice(["left", "right"])

    env = ChainEnv(num_tasks=1, max_steps=4)
    state = await env.reset(0)
    runner = TrajectoryRunner(env, ScriptedBackend(policy), SamplingParams(seed=3))
    first = await estimate_values(runner, [state], 32)
    again = await estimate_values(runner, [state], 32)
    fresh = await estimate_values(runner, [state], 32, first_rollout_id=32)
    assert first[0].returns == again[0].returns
    assert first[0].returns != fresh[0].returns
    q = await estimate_q_values(runner, state, ["right"], 32)
    q_fresh = await estimate_q_values(runner, state, ["right"], 32, first_rollout_id=32)
    assert q[0].returns != q_fresh[0].returns
    with pytest.raises(ValueError, match="first_rollout_id must be an int >= 0, got -1"):
        await estimate_values(runner, [state], 4, first_rollout_id=-1)
