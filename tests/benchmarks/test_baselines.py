"""The seed baseline and the shared workload run the same work as the framework."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks._workload import LatencyBackend, LoggedCounterEnv, counting_policy, critical_path
from benchmarks.baselines import (
    LoopThread,
    SyncCounterEnv,
    SyncLatencyBackend,
    SyncTrajectoryRunner,
    ThreadedEnv,
    drive,
    floor_lockstep,
    sync_replay_restore,
)
from llenvs_async import Action, State, TrajectoryRunner
from llenvs_async.envs import CounterEnv


def test_critical_path_is_slowest_reset_plus_generate_and_slowest_step_per_round() -> None:
    delays = [[0.1, 0.2, 0.3], [0.4, 0.1, 0.1]]
    assert critical_path(delays, 1.0) == pytest.approx(0.4 + (1.0 + 0.2) + (1.0 + 0.3))
    assert critical_path([[0.1, 0.2], [0.1, 0.2, 0.5]], 0.0) == pytest.approx(0.1 + 0.2 + 0.5)


def test_logged_env_records_one_delay_per_io_within_the_jitter() -> None:
    async def go() -> LoggedCounterEnv:
        env = LoggedCounterEnv(latency=0.002, jitter=0.001)
        state = await env.reset(1)
        await env.step(state, Action(text="inc"))
        return env

    env = asyncio.run(go())
    assert len(env.delays) == 2
    assert all(0.001 <= d <= 0.003 for d in env.delays)


def test_drive_refuses_a_coroutine_that_suspends() -> None:
    with pytest.raises(RuntimeError, match="never suspends"):
        drive(asyncio.sleep(0))


def test_seed_runner_takes_the_same_steps_as_the_framework() -> None:
    envs: list[SyncCounterEnv] = []

    def factory() -> SyncCounterEnv:
        envs.append(SyncCounterEnv(latency=0.001, jitter=0.0005))
        return envs[-1]

    seed = SyncTrajectoryRunner(SyncLatencyBackend(0.001, counting_policy), factory)
    seed_trajs = seed.run_batch([2, 0, 3], batch_size=2)

    async def ours() -> list[tuple[str, ...]]:
        async def make() -> LoggedCounterEnv:
            return LoggedCounterEnv()

        runner = TrajectoryRunner(CounterEnv(), LatencyBackend(0.001), env_factory=make)
        trajs = await runner.run_batch([2, 0, 3], batch_size=2)
        return [tuple(a.text for a in t.actions) for t in trajs]

    assert [t.index for t in seed_trajs] == [0, 1, 2]
    assert all(t.success for t in seed_trajs)
    assert [tuple(a.text for a in t.actions) for t in seed_trajs] == asyncio.run(ours())
    assert len(envs) == 3 and all(e.env.closed for e in envs)
    assert [len(e.delays) for e in envs] == [4, 2, 5]  # reset + steps, each slept


def test_seed_runner_restores_states_through_a_threaded_async_env() -> None:
    async def saved() -> State:
        env = CounterEnv()
        state = await env.reset(2)
        return (await env.step(state, Action(text="inc"))).next_state

    state = asyncio.run(saved())
    with LoopThread() as loop:
        seed = SyncTrajectoryRunner(
            SyncLatencyBackend(0.0, counting_policy),
            lambda: ThreadedEnv(CounterEnv(), loop),
            restore_fn=sync_replay_restore,
        )
        trajs = seed.run_batch_from_states([state, state])
    assert all(t.success and t.initial_state.step == 1 for t in trajs)
    assert [t.actions[0].text for t in trajs] == ["inc", "inc"]


def test_asyncio_floor_runs_every_rollout_to_its_end() -> None:
    envs = [LoggedCounterEnv() for _ in range(3)]
    finals = asyncio.run(floor_lockstep(envs, LatencyBackend(0.0), 2))
    assert [(s.step, s.terminated) for s in finals] == [(3, True)] * 3
    assert all(env.closed for env in envs)
