"""Refill scheduling: freed slots take the next input; order, cap and one generate per round."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from llenvs_async import ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import CounterEnv
from llenvs_async.testing import RecordingBackend

from .conftest import counter_policy


def _long_tailed_targets(n: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [min(int(rng.paretovariate(1.2)), 18) for _ in range(n)]  # max_steps is 20


@pytest.mark.parametrize("schedule", ["refill", "chunks"])
async def test_results_keep_input_order_and_the_cap(schedule, counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    targets = _long_tailed_targets(64)
    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    trajs = await runner.run_batch(targets, batch_size=8, schedule=schedule)
    assert [t.index for t in trajs] == list(range(64))
    assert [t.initial_state.task for t in trajs] == targets
    assert all(t.success and len(t) == target + 1 for t, target in zip(trajs, targets, strict=True))
    assert runner.stats.peak_live_instances == 8 and tracker.peak_live == 8
    assert tracker.live == 0 and runner.stats.live_instances == 0
    assert runner.stats.generate_calls == runner.stats.rounds == len(backend.calls)
    assert max(backend.batch_sizes) == 8
    # every step of every rollout was generated in exactly one round
    assert sum(backend.batch_sizes) == sum(len(t) for t in trajs)


async def test_refill_needs_fewer_rounds_than_chunks(counter_factory) -> None:  # type: ignore[no-untyped-def]
    targets = _long_tailed_targets(64)
    rounds = {}
    for schedule in ("refill", "chunks"):
        runner = TrajectoryRunner(
            environment=CounterEnv(),
            backend=ScriptedBackend(counter_policy),
            env_factory=counter_factory(),
        )
        await runner.run_batch(targets, batch_size=8, schedule=schedule)
        rounds[schedule] = runner.stats.rounds
    # chunks wait for each chunk's slowest rollout; refill keeps the slots busy
    lower_bound = -(-sum(t + 1 for t in targets) // 8)  # total steps / slots, rounded up
    assert lower_bound <= rounds["refill"] < rounds["chunks"]
    assert rounds["refill"] <= 1.25 * lower_bound + max(targets)


async def test_trajectories_stream_as_they_finish(counter_factory) -> None:  # type: ignore[no-untyped-def]
    env = CounterEnv()
    states = [await env.reset(t) for t in (9, 1, 5, 1)]
    runner = TrajectoryRunner(
        environment=env, backend=ScriptedBackend(counter_policy), env_factory=counter_factory()
    )
    order = [t.index async for t in runner.iter_batch_from_states(states, batch_size=2)]
    # input 1 (2 steps) finishes first, while input 0 (10 steps) still runs; its slot goes
    # to input 2; input 3 waits for the next slot, so it finishes last
    assert order[0] == 1 and order[-1] == 3 and sorted(order) == [0, 1, 2, 3]


async def test_the_next_round_does_not_wait_for_a_close(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    """Teardown off the critical path: a finished instance's close is still in flight
    while the next round generates."""
    release = asyncio.Event()
    closing = 0
    seen_while_closing: list[int] = []

    class SlowClose(CounterEnv):
        async def _aclose(self) -> None:
            nonlocal closing
            closing += 1
            await release.wait()
            await super()._aclose()

    async def factory() -> CounterEnv:
        return SlowClose(tracker=tracker)

    def policy(request):  # type: ignore[no-untyped-def]
        seen_while_closing.append(closing)
        if request.rollout_index == 1 and request.step >= 3:
            release.set()  # the long rollout lets the closes finish only now
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(policy),
        env_factory=factory,
        close_timeout=2,  # a close awaited inside the round would deadlock, then time out
    )
    trajs = await runner.run_batch([1, 4])
    assert all(t.success for t in trajs)
    # rollout 0 finished in round 2; rounds 3 and 4 of rollout 1 ran while it was closing
    assert seen_while_closing[-3:-1] == [1, 1]
    # ...and the close then completed (a timed-out close would leave the instance live)
    assert tracker.live == 0 and runner.stats.live_instances == 0


async def test_one_instance_limit_is_shared_by_concurrent_runs(tracker) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=0.001)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=factory,
        instance_limit=3,
    )
    runs = [runner.run_batch(_long_tailed_targets(6, seed=s), batch_size=4) for s in range(4)]
    results = await asyncio.gather(*runs)
    assert all(t.success for trajs in results for t in trajs)
    assert tracker.peak_live == 3 and tracker.live == 0
    assert runner.instance_slots is not None and runner.instance_slots.peak == 3
    assert runner.instance_slots.free() == 3


def test_bad_schedule_and_limit_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="schedule"):
        TrajectoryRunner(CounterEnv(), ScriptedBackend(counter_policy), schedule="fifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="instance_limit"):
        TrajectoryRunner(CounterEnv(), ScriptedBackend(counter_policy), instance_limit=0)


async def test_cancelled_refill_run_closes_everything(tracker) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=0.01)

    targets = _long_tailed_targets(32)
    # the first 6 inputs finish within 14 steps, input 10 alone needs 19: at the 40th step
    # the run has refilled slots (created > 6) and is still far from its end
    assert sum(t + 1 for t in targets[:6]) < 40 < sum(t + 1 for t in targets)
    forty_steps = asyncio.Event()

    def policy(request):  # type: ignore[no-untyped-def]
        if tracker.steps >= 40:
            forty_steps.set()
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=factory
    )
    task = asyncio.ensure_future(runner.run_batch(targets, batch_size=6))
    reached = asyncio.ensure_future(forty_steps.wait())
    # hang guard only: a run that fails or ends first is reported by the assert below
    await asyncio.wait({task, reached}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    reached.cancel()
    assert forty_steps.is_set() and not task.done(), task
    created, live = tracker.created, tracker.live
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert created > 6 and live > 0  # cancelled mid-run, with instances open
    assert tracker.live == 0 and tracker.closed == tracker.created


async def test_a_slow_restore_does_not_hold_the_rounds_back(tracker) -> None:  # type: ignore[no-untyped-def]
    """Input 2's reset blocks until input 0 has stepped on for several rounds: the rounds
    must go on while it is being prepared (a round that waited for it would deadlock)."""
    gate = asyncio.Event()

    class GatedReset(CounterEnv):
        async def _reset(self, task, *, seed):  # type: ignore[no-untyped-def]
            if task == 2:
                await asyncio.wait_for(gate.wait(), timeout=5)
            return await super()._reset(task, seed=seed)

    async def factory() -> CounterEnv:
        return GatedReset(tracker=tracker)

    def policy(request):  # type: ignore[no-untyped-def]
        if request.rollout_index == 0 and request.step == 6:
            gate.set()
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=factory
    )
    trajs = await runner.run_batch([9, 1, 2], batch_size=2)
    assert [t.error for t in trajs] == [None, None, None]
    assert all(t.success for t in trajs) and tracker.live == 0
    assert runner.stats.peak_live_instances == 2


async def test_a_prepared_input_waiting_for_a_slow_round_does_not_spin(
    counter_factory, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Input 2 is prepared while round 2 (0.3 s of generate) runs: the loop must wait for
    the round, not wake again and again on the finished preparation."""
    from llenvs_async.runner import _lockstep

    wakes = 0
    real = _lockstep.first_of

    async def counting(waits, keep=None):  # type: ignore[no-untyped-def]
        nonlocal wakes
        wakes += 1
        return await real(waits, keep)

    monkeypatch.setattr(_lockstep, "first_of", counting)

    class Slow(ScriptedBackend):
        async def generate(self, requests, params):  # type: ignore[no-untyped-def]
            if requests[0].step == 1:
                await asyncio.sleep(0.3)
            return await super().generate(requests, params)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=Slow(counter_policy), env_factory=counter_factory()
    )
    trajs = await runner.run_batch([0, 2, 0, 0], batch_size=2)
    assert all(t.success for t in trajs)
    assert wakes < 20  # a spinning loop wakes thousands of times in 0.3 s


async def test_breaking_off_while_a_slow_factory_runs_is_quiet_and_leak_free(tracker) -> None:  # type: ignore[no-untyped-def]
    """Teardown gives a factory call its grace (close_timeout) and waits a little longer:
    no TimeoutError escapes the early break, nothing stays open."""

    async def slow_factory() -> CounterEnv:
        await asyncio.sleep(0.5)
        return CounterEnv(tracker=tracker)

    env = CounterEnv()
    states = [await env.reset(t) for t in (0, 3, 3, 3)]
    runner = TrajectoryRunner(
        environment=env,
        backend=ScriptedBackend(counter_policy),
        env_factory=slow_factory,
        close_timeout=0.2,
    )
    seen = []
    async with contextlib.aclosing(runner.iter_batch_from_states(states, batch_size=2)) as it:
        async for traj in it:
            seen.append(traj.index)
            if traj.index == 1:
                break
    assert seen[-1] == 1
    assert tracker.live == 0 and runner.stats.live_instances == 0
