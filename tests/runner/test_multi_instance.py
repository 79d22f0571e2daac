"""The multi-instance path: one restored instance per rollout, capped by batch_size."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async import Action, RestoreError, ScriptedBackend, State, TrajectoryRunner
from llenvs_async.envs import ChainEnv, CounterEnv

from .conftest import counter_policy


async def _saved_state(env: CounterEnv, target: int, prefix: list[str]) -> State:
    s = await env.reset(target)
    for text in prefix:
        s = (await env.step(s, Action(text=text))).next_state
    return s


async def test_batch_size_caps_live_instances_and_chunks_run_in_sequence(
    counter_factory, tracker, recording
) -> None:  # type: ignore[no-untyped-def]
    main = CounterEnv()
    state = await _saved_state(main, 3, ["inc"])
    runner = TrajectoryRunner(
        environment=main, backend=recording, env_factory=counter_factory(latency=0.002)
    )
    trajs = await runner.run_batch_from_states([state] * 10, batch_size=4, schedule="chunks")
    assert len(trajs) == 10 and all(t.success for t in trajs)
    assert tracker.created == 10 and tracker.peak_live == 4 and tracker.live == 0
    assert runner.stats.peak_live_instances == 4 and runner.stats.live_instances == 0
    # chunks of 4, 4, 2: every round of a chunk is one call; a chunk needs 3 rounds
    assert recording.batch_sizes == [4, 4, 4, 4, 4, 4, 2, 2, 2]


async def test_restores_run_concurrently(tracker) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()
    waiting = 0
    B = 8

    class Gated(CounterEnv):
        async def _reset(self, task, *, seed):  # type: ignore[no-untyped-def]
            nonlocal waiting
            waiting += 1
            if waiting == B:
                gate.set()  # only reached if all B restores are in flight together
            await asyncio.wait_for(gate.wait(), timeout=5)
            return await super()._reset(task, seed=seed)

    async def factory() -> CounterEnv:
        return Gated(tracker=tracker, reset_latency=0.01)

    state = await _saved_state(CounterEnv(), 2, ["inc"])
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    trajs = await runner.run_batch_from_states([state] * B, batch_size=B)
    assert all(t.error is None for t in trajs)
    assert tracker.peak_in_reset == B and runner.stats.peak_restoring == B


async def test_restored_instances_start_from_the_saved_state(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    main = CounterEnv()
    state = await _saved_state(main, 5, ["add 3", "inc"])
    seen: list[str] = []

    def policy(request):  # type: ignore[no-untyped-def]
        seen.append(request.messages[-1].content)
        return "submit"

    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(policy), env_factory=counter_factory()
    )
    trajs = await runner.run_batch_from_states([state, state])
    assert {t.initial_state.step for t in trajs} == {2}
    assert seen == ["Counter is 4.", "Counter is 4."]
    # the restored episode is the fresh instance's, not the saved one
    assert all(t.initial_state.episode_id != state.episode_id for t in trajs)
    assert tracker.resets == 2 and tracker.steps == 2 * 2 + 2


@pytest.mark.parametrize("k", [0, 1, 3])
async def test_restored_rollout_sends_the_original_conversation(counter_factory, k) -> None:  # type: ignore[no-untyped-def]
    """The first request after restoring step k equals the original request at step k,
    message for message (system prompt, instruction, every action and observation)."""
    original: list[tuple[int, tuple]] = []  # type: ignore[type-arg]

    def policy(request):  # type: ignore[no-untyped-def]
        original.append((request.step, request.messages))
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(policy),
        env_factory=counter_factory(),
        system_prompt="You count.",
    )
    [traj] = await runner.run_batch([5])
    assert traj.success and len(traj) == 6
    sent_at = dict(original)
    saved = traj.states[k]
    assert saved.history.complete and len(saved.history) == k

    restored_first: list[tuple] = []  # type: ignore[type-arg]

    def record(request):  # type: ignore[no-untyped-def]
        restored_first.append(request.messages)
        return "submit"

    runner.backend = ScriptedBackend(record)
    [again] = await runner.run_batch_from_states([saved], max_steps=1)
    assert again.error is None
    assert restored_first[0] == sent_at[k]
    assert restored_first[0][0].role == "system" and "Reach 5" in restored_first[0][1].content
    assert len(restored_first[0]) == 2 + 2 * k
    # the restored trajectory carries the saved history, extended by its own step
    assert again.initial_state.actions is saved.actions  # shared, not copied
    assert again.final_state.history.extends(saved.history)


async def test_pure_env_bypasses_the_factory() -> None:
    calls = 0

    async def factory() -> ChainEnv:
        nonlocal calls
        calls += 1
        return ChainEnv()

    env = ChainEnv(min_length=2)
    start = await env.reset(0)
    runner = TrajectoryRunner(
        environment=env, backend=ScriptedBackend(lambda r: "right"), env_factory=factory
    )
    trajs = await runner.run_batch_from_states([start] * 6, batch_size=2)
    trajs += await runner.run_batch([0, 1])
    assert calls == 0 and all(t.success for t in trajs)
    assert not runner.multi_instance


async def test_non_pure_without_factory_takes_turns_on_the_one_instance(tracker) -> None:  # type: ignore[no-untyped-def]
    env = CounterEnv(tracker=tracker, latency=0.001)
    state = await _saved_state(env, 2, ["inc"])
    runner = TrajectoryRunner(environment=env, backend=ScriptedBackend(counter_policy))
    trajs = await runner.run_batch_from_states([state] * 3, batch_size=3)
    assert all(t.success for t in trajs)
    assert tracker.peak_in_step == 1 and not env.closed  # the user's env is not closed


async def test_failed_restore_is_recorded(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    async def restore(env, state):  # type: ignore[no-untyped-def]
        if state.task == 9:
            raise RestoreError("cannot restore task 9")
        from llenvs_async import replay_restore

        return await replay_restore(env, state)

    good = await _saved_state(CounterEnv(), 1, [])
    bad = await _saved_state(CounterEnv(), 9, ["inc"])
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=counter_factory(),
        restore_fn=restore,
    )
    trajs = await runner.run_batch_from_states([good, bad, good])
    assert trajs[1].error is not None and trajs[1].error.phase == "restore"
    assert trajs[1].initial_state is bad and trajs[0].success and trajs[2].success
    assert tracker.live == 0


async def test_failing_factory_is_recorded(tracker) -> None:  # type: ignore[no-untyped-def]
    made = 0

    async def factory() -> CounterEnv:
        nonlocal made
        made += 1
        if made == 2:
            raise OSError("no more containers")
        return CounterEnv(tracker=tracker)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    trajs = await runner.run_batch([1, 1, 1], batch_size=3)
    assert sum(t.error is not None for t in trajs) == 1
    assert next(t for t in trajs if t.error).error.phase == "factory"  # type: ignore[union-attr]
    assert tracker.live == 0


async def test_concurrent_runs_on_one_runner_do_not_interleave(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    main = CounterEnv()
    s2 = await _saved_state(main, 2, [])
    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(counter_policy), env_factory=counter_factory()
    )
    s4 = await _saved_state(CounterEnv(), 4, ["inc"])
    a, b = await asyncio.gather(
        runner.run_batch_from_states([s2] * 5, batch_size=2),
        runner.run_batch_from_states([s4] * 3, batch_size=3),
    )
    assert all(t.success for t in a + b)
    assert [len(t) for t in a] == [3] * 5 and [len(t) for t in b] == [4] * 3
    assert tracker.live == 0


async def test_iter_yields_as_rollouts_finish(counter_factory) -> None:  # type: ignore[no-untyped-def]
    main = CounterEnv()
    states = [await _saved_state(CounterEnv(), t, []) for t in (3, 1, 2)]
    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(counter_policy), env_factory=counter_factory()
    )
    order = [t.index async for t in runner.iter_batch_from_states(states)]
    assert order == [1, 2, 0]  # shortest first


async def test_runner_closes_a_restore_fn_that_holds_resources() -> None:
    from llenvs_async import ClosedError, replay_restore

    class Holding:
        closed = 0

        async def __call__(self, env, state):  # type: ignore[no-untyped-def]
            return await replay_restore(env, state)

        async def aclose(self) -> None:
            self.closed += 1

    restore = Holding()
    async with TrajectoryRunner(
        environment=ChainEnv(), backend=ScriptedBackend(lambda r: "right"), restore_fn=restore
    ) as runner:
        await runner.run_batch([0])
    await runner.aclose()
    assert restore.closed == 1
    with pytest.raises(ClosedError):
        await runner.run_batch([0])


async def test_concurrent_runs_on_one_shared_stateful_instance_take_turns(tracker) -> None:  # type: ignore[no-untyped-def]
    env = CounterEnv(tracker=tracker, latency=0.001)
    s2 = await _saved_state(env, 2, ["inc"])
    s3 = await _saved_state(env, 3, [])
    runner = TrajectoryRunner(environment=env, backend=ScriptedBackend(counter_policy))
    a, b = await asyncio.gather(
        runner.run_batch_from_states([s2] * 2), runner.run_batch_from_states([s3] * 2)
    )
    assert all(t.success for t in a + b)  # no StaleStateError from interleaved runs
    assert [len(t) for t in a] == [2, 2] and [len(t) for t in b] == [4, 4]
    assert tracker.peak_in_step == 1


async def test_terminal_start_state_needs_no_instance(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    main = CounterEnv()
    s = await main.reset(0)
    done = (await main.step(s, Action(text="submit"))).next_state
    runner = TrajectoryRunner(
        environment=main, backend=ScriptedBackend(counter_policy), env_factory=counter_factory()
    )
    [traj] = await runner.run_batch_from_states([done])
    assert len(traj) == 0 and traj.stop_reason == "terminated" and tracker.created == 0


async def test_restore_timeout_is_a_named_restore_error(tracker) -> None:  # type: ignore[no-untyped-def]
    async def slow_restore(env, state):  # type: ignore[no-untyped-def]
        await asyncio.Event().wait()

    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker)

    state = await _saved_state(CounterEnv(), 2, ["inc"])
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=factory,
        restore_fn=slow_restore,
        restore_timeout=0.05,
    )
    [traj] = await runner.run_batch_from_states([state])
    assert traj.error is not None and traj.error.type == "RestoreError"
    assert "restore_timeout=0.05" in traj.error.message and tracker.live == 0
