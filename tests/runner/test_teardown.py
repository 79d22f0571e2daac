"""Every instance is closed on success, error, cancellation and early exit; Ctrl-C too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from llenvs_async import Action, GenerationRequest, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import CounterEnv, InstanceTracker
from llenvs_async.runner._run import first_of

from .conftest import counter_policy


async def _state(target: int = 3) -> object:
    env = CounterEnv()
    return await env.reset(target)


async def test_closed_after_success(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=counter_factory(),
    )
    await runner.run_batch([2] * 6, batch_size=3)
    assert tracker.created == 6 and tracker.live == 0


async def test_closed_after_a_programming_error(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    def policy(request: GenerationRequest) -> str:
        if request.step == 1:
            raise TypeError("bug")
        return "inc"

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=counter_factory()
    )
    with pytest.raises(TypeError):
        await runner.run_batch([5] * 4)
    assert tracker.created == 4 and tracker.live == 0


async def test_a_programming_error_carries_the_finished_trajectories(counter_factory) -> None:  # type: ignore[no-untyped-def]
    """Chunks of 2: the first chunk (targets 1) finishes, the second hits a bug."""

    def policy(request: GenerationRequest) -> str:
        if request.rollout_index >= 2:
            raise TypeError("bug in the policy")
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=counter_factory()
    )
    with pytest.raises(TypeError) as info:
        await runner.run_batch([1, 1, 5, 5], batch_size=2)
    done = info.value.finished_trajectories  # type: ignore[attr-defined]
    assert sorted(t.index for t in done) == [0, 1]
    assert all(t.success for t in done)
    assert any("finished_trajectories" in note for note in info.value.__notes__)


async def test_closed_after_cancellation_mid_round(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    in_step = asyncio.Event()
    stepping = 0

    class Hanging(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            nonlocal stepping
            stepping += 1
            if stepping == 5:
                in_step.set()  # all five steps of the round are in flight
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    async def factory() -> CounterEnv:
        return Hanging(tracker=tracker)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    task = asyncio.create_task(runner.run_batch([3] * 5))
    await asyncio.wait_for(in_step.wait(), timeout=5)
    assert tracker.live == 5
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.live == 0 and runner.stats.live_instances == 0


async def test_closed_after_cancellation_during_restore(tracker) -> None:  # type: ignore[no-untyped-def]
    restoring = asyncio.Event()

    class SlowReset(CounterEnv):
        async def _reset(self, task, *, seed):  # type: ignore[no-untyped-def]
            restoring.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    async def factory() -> CounterEnv:
        return SlowReset(tracker=tracker)

    state = await _state()
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    task = asyncio.create_task(runner.run_batch_from_states([state] * 4))  # type: ignore[list-item]
    await asyncio.wait_for(restoring.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.created == 4 and tracker.live == 0


async def test_closing_is_shielded_from_a_second_cancellation(tracker) -> None:  # type: ignore[no-untyped-def]
    closing = asyncio.Event()

    class SlowClose(CounterEnv):
        async def _aclose(self) -> None:
            closing.set()
            await asyncio.sleep(0.05)
            await super()._aclose()

    async def factory() -> CounterEnv:
        return SlowClose(tracker=tracker)

    in_step = asyncio.Event()

    def policy(request: GenerationRequest) -> str:
        in_step.set()
        return "inc"

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=factory
    )
    task = asyncio.create_task(runner.run_batch([1000] * 3))
    await asyncio.wait_for(in_step.wait(), timeout=5)
    task.cancel()
    await asyncio.wait_for(closing.wait(), timeout=5)
    task.cancel()  # cancelled again while closing: closing still completes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.live == 0


async def test_close_is_bounded_in_time(tracker) -> None:  # type: ignore[no-untyped-def]
    class NeverCloses(CounterEnv):
        async def _aclose(self) -> None:
            await asyncio.Event().wait()

    async def factory() -> CounterEnv:
        return NeverCloses(tracker=tracker)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(lambda r: "submit"),
        env_factory=factory,
        close_timeout=0.05,
    )
    trajs = await asyncio.wait_for(runner.run_batch([0, 0]), timeout=10)
    assert all(t.error is None for t in trajs) and runner.stats.live_instances == 0


async def test_early_exit_from_iteration_closes_instances(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    states = [await _state(t) for t in (1, 50, 50)]
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=counter_factory(),
    )
    async with contextlib.aclosing(runner.iter_batch_from_states(states)) as it:  # type: ignore[arg-type]
        async for first in it:
            assert first.index == 0
            assert tracker.live == 2  # the finished one is already closed
            break
    assert tracker.live == 0


SIGINT_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from llenvs_async import ScriptedBackend, TrajectoryRunner
    from llenvs_async.envs import CounterEnv, InstanceTracker

    tracker = InstanceTracker()

    async def factory():
        return CounterEnv(tracker=tracker, latency=0.05)

    async def main():
        def policy(request):
            if request.step == 2:
                print("RUNNING", flush=True)
            return "inc"
        runner = TrajectoryRunner(environment=CounterEnv(), backend=ScriptedBackend(policy),
                                  env_factory=factory)
        await runner.run_batch([10**6] * 16)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print(f"INTERRUPTED created={tracker.created} live={tracker.live}", flush=True)
        sys.exit(0)
    print("FINISHED", flush=True)
    """
)


def test_ctrl_c_closes_every_instance() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "RUNNING"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "INTERRUPTED created=16 live=0" in out, (out, err)


def test_instance_tracker_is_exported() -> None:
    assert InstanceTracker().live == 0 and Action(text="x").text == "x"


async def test_close_started_inside_a_round_survives_cancellation(tracker) -> None:  # type: ignore[no-untyped-def]
    # Rollout 0 finishes in round 1 and starts closing while rollout 1's step hangs; the
    # run is cancelled mid-close. asyncio's TaskGroup cancels its children natively,
    # which an anyio shield alone does not stop: the close must still complete.
    closing = asyncio.Event()

    class SlowCloseHangingStep(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if action.text == "hang":
                await asyncio.Event().wait()
            return await super()._step(state, action)

        async def _aclose(self) -> None:
            closing.set()
            await asyncio.sleep(0.05)
            await super()._aclose()

    async def factory() -> CounterEnv:
        return SlowCloseHangingStep(tracker=tracker)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(lambda r: "submit" if r.rollout_index == 0 else "hang"),
        env_factory=factory,
    )
    task = asyncio.create_task(runner.run_batch([0, 0]))
    await asyncio.wait_for(closing.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.created == 2 and tracker.live == 0
    assert runner.stats.live_instances == 0


async def test_instance_built_while_the_run_is_cancelled_is_closed(tracker) -> None:  # type: ignore[no-untyped-def]
    # The factory has already created its instance (a container) when the run is
    # cancelled; the instance must still reach teardown instead of being lost.
    creating = asyncio.Event()

    async def factory() -> CounterEnv:
        env = CounterEnv(tracker=tracker)
        creating.set()
        await asyncio.sleep(0.05)  # e.g. starting the container
        return env

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    task = asyncio.create_task(runner.run_batch([3, 3]))
    await asyncio.wait_for(creating.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.created == 2 and tracker.live == 0
    assert runner.stats.live_instances == 0


async def test_closed_after_an_anyio_cancel_scope_expires(tracker) -> None:  # type: ignore[no-untyped-def]
    import anyio

    class SlowClose(CounterEnv):
        async def _aclose(self) -> None:
            await asyncio.sleep(0.05)  # anyio keeps re-delivering the cancellation meanwhile
            await super()._aclose()

    async def factory() -> CounterEnv:
        return SlowClose(tracker=tracker, latency=0.01)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    with anyio.move_on_after(0.1) as scope:
        await runner.run_batch([10**6] * 4)
    assert scope.cancelled_caught
    assert tracker.created == 4 and tracker.live == 0 and runner.stats.live_instances == 0


@pytest.mark.parametrize("schedule", ["refill", "chunks", "async"])
async def test_a_reset_leaking_cancelled_error_is_a_recorded_failure(schedule) -> None:  # type: ignore[no-untyped-def]
    """Nobody cancelled the run: a CancelledError out of reset is that rollout's failure."""

    class Leaky(CounterEnv):
        async def _reset(self, task, *, seed=None):  # type: ignore[no-untyped-def]
            if task == 2:
                raise asyncio.CancelledError("leaked from a library")
            return await super()._reset(task, seed=seed)

    async def factory() -> CounterEnv:
        return Leaky()

    runner = TrajectoryRunner(
        environment=Leaky(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    trajs = await runner.run_batch([1, 2, 3], batch_size=3, schedule=schedule)
    assert [t.error is None for t in trajs] == [True, False, True]
    assert trajs[1].error is not None and trajs[1].error.phase == "reset"
    assert "without being cancelled" in trajs[1].error.message
    assert runner.stats.live_instances == 0


async def test_first_of_leaves_no_helper_task_behind() -> None:
    """Every wake-up of a scheduler goes through ``first_of``: the waits it did not need
    are over when it returns (no orphan tasks piling up), whether it returned or was
    cancelled."""
    before = asyncio.all_tasks()
    fired = asyncio.Event()
    fired.set()
    await first_of([fired.wait(), asyncio.Event().wait(), asyncio.sleep(3600)])
    assert asyncio.all_tasks() == before
    waiting = asyncio.ensure_future(first_of([asyncio.Event().wait(), asyncio.sleep(3600)]))
    await asyncio.sleep(0)  # one loop turn: it runs up to its wait
    assert len(asyncio.all_tasks() - before) == 3  # it and its two helpers: inside the wait
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert asyncio.all_tasks() == before
