"""runner.stream: complete groups as they finish, staleness bound, backpressure, teardown."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator, Sequence

import pytest

from llenvs_async import (
    Action,
    Completion,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async.envs import CounterEnv
from llenvs_async.envs.arithmetic import ArithmeticEnv

from .conftest import counter_policy


class VersionedBackend(ScriptedBackend):
    """ScriptedBackend whose completions carry ``policy_version`` as it is after ``delay``
    (engine time); ``update_weights`` (ScriptedBackend's) bumps it, the trainer's side."""

    def __init__(self, policy, delay: float = 0.0) -> None:  # type: ignore[no-untyped-def]
        super().__init__(policy, policy_version=0)
        self.delay = delay

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        out = await super().generate(requests, params)
        if self.delay:
            await asyncio.sleep(self.delay)
        return [dataclasses.replace(c, policy_version=self.policy_version) for c in out]


def _staleness(backend: VersionedBackend, group: Sequence[object]) -> int:
    versions = [v for t in group for v in t.policy_versions]  # type: ignore[attr-defined]
    return backend.policy_version - min(versions)


async def _endless(targets: Sequence[int]) -> AsyncIterator[int]:
    for target in itertools.cycle(targets):
        yield target


async def test_groups_come_whole_and_in_input_order_within_the_group(
    counter_factory, tracker
) -> None:  # type: ignore[no-untyped-def]
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=counter_factory(),
    )
    targets = [5, 0, 3, 1, 2]
    seen: dict[int, list[object]] = {}
    async with runner.stream(targets, group_size=3, batch_size=4) as stream:
        async for group in stream:
            assert len(group) == 3
            indices = [t.index for t in group]
            assert indices[0] % 3 == 0 and indices == [indices[0] + j for j in range(3)]
            (task,) = {t.initial_state.task for t in group}
            seen[indices[0] // 3] = [task]
            assert all(t.success and len(t) == task + 1 for t in group)
    assert {g: v[0] for g, v in seen.items()} == dict(enumerate(targets))
    assert stream.stats.groups_yielded == stream.stats.groups_started == 5
    assert stream.stats.rollouts_started == 15
    assert runner.stats.peak_live_instances <= 4 and tracker.live == 0


@pytest.mark.parametrize("schedule", ["refill", "async"])
@pytest.mark.parametrize("trainer", ["slower", "faster"])
async def test_the_staleness_bound_holds(
    trainer: str, schedule: str, counter_factory, tracker
) -> None:  # type: ignore[no-untyped-def]
    """Versions bumped by the trainer after every group; long-tailed rollouts (targets
    0..9) finish out of order. No yielded group is more than 1 version stale."""
    backend = VersionedBackend(counter_policy, delay=0.0 if trainer == "slower" else 0.002)
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    targets = [9, 0, 4, 1, 7, 2, 0, 5]
    async with runner.stream(
        _endless(targets),
        group_size=2,
        batch_size=8,
        max_staleness=1,
        schedule=schedule,  # type: ignore[arg-type]
    ) as stream:
        step = 0
        async for group in stream:
            assert _staleness(backend, group) <= 1
            if trainer == "slower":
                await asyncio.sleep(0.01)  # training takes longer than a rollout
            step += 1
            await backend.update_weights((), version=step)
            if step == 24:
                break
    stats = stream.stats
    assert stats.groups_yielded == 24 and stats.max_staleness_seen <= 1
    # admission control: a group outstanding at most (1 + max_staleness) deep
    assert stats.outstanding_high_water <= 2
    assert stats.groups_started >= stats.groups_yielded + stats.discarded_stale
    assert tracker.live == 0 and runner.stats.live_instances == 0


async def test_a_group_stale_at_yield_time_is_discarded_counted_and_rerun(
    counter_factory,
) -> None:  # type: ignore[no-untyped-def]
    """The trainer jumps 3 versions per update, more than admission assumed: the long
    rollout (task 9, started at version 0) is 3 behind when it would be yielded."""
    backend = VersionedBackend(counter_policy)
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    tasks = []
    async with runner.stream([9, 0], group_size=1, batch_size=2, max_staleness=1) as stream:
        async for (trajectory,) in stream:
            assert _staleness(backend, [trajectory]) <= 1
            tasks.append(trajectory.initial_state.task)
            await backend.update_weights((), version=backend.policy_version + 3)
    assert tasks == [0, 9]  # nothing lost: the discarded input was rolled out again
    assert stream.stats.discarded_stale == 1 and stream.stats.groups_started == 3


async def test_with_max_staleness_0_generation_is_on_policy(counter_factory) -> None:  # type: ignore[no-untyped-def]
    backend = VersionedBackend(counter_policy)
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    async with runner.stream(
        _endless([3, 1]), group_size=2, batch_size=8, max_staleness=0
    ) as stream:
        async for step, group in aenumerate(stream):
            assert {v for t in group for v in t.policy_versions} == {step}
            await backend.update_weights((), version=step + 1)
            if step == 5:
                break
    assert stream.stats.discarded_stale == 0 and stream.stats.outstanding_high_water == 1


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_a_trainer_taking_several_groups_per_version_gets_them_in_parallel(
    counter_factory, schedule
) -> None:  # type: ignore[no-untyped-def]
    """The stream learns that the consumer takes 3 groups per update and admits that many
    at once, still on-policy with max_staleness=0."""
    backend = VersionedBackend(counter_policy)
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    async with runner.stream(
        _endless([2, 4, 1]), group_size=2, batch_size=8, max_staleness=0, schedule=schedule
    ) as stream:
        taken = 0
        async for group in stream:
            assert _staleness(backend, group) == 0
            taken += 1
            if taken % 3 == 0:
                await backend.update_weights((), version=taken // 3)
            if taken == 12:
                break
    assert stream.stats.groups_per_version == 3
    assert stream.stats.outstanding_high_water == 3 and stream.stats.max_staleness_seen == 0


async def test_a_slow_consumer_pauses_production_not_rollouts_in_flight(counter_factory) -> None:  # type: ignore[no-untyped-def]
    backend = ScriptedBackend(counter_policy)
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    async with runner.stream(_endless([4, 1, 6]), group_size=2, batch_size=8, queue_size=3) as s:
        refused = asyncio.Event()  # the scheduler asked for a new group with a full queue
        admits = s.admits

        def watched() -> bool:
            ok = admits()
            if not ok and s.stats.queue_high_water == 3:
                refused.set()
            return ok

        s.admits = watched  # type: ignore[method-assign]
        first = await anext(s)  # then the consumer "trains" for a long time
        await asyncio.wait_for(refused.wait(), timeout=30)  # the in-flight groups completed
        started = s.stats.rollouts_started
        assert s.stats.rollouts_started == started == (1 + 3) * 2  # production paused
        assert runner.stats.active_rollouts == 0 and runner.stats.live_instances == 0
        rest = [await anext(s) for _ in range(5)]
    assert len(first) == 2 and all(len(g) == 2 for g in rest)
    assert s.stats.queue_high_water <= 3 and s.stats.outstanding_high_water <= 3


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_cancelling_the_consumer_tears_every_instance_down(tracker, schedule) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=0.005)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(counter_policy), env_factory=factory
    )
    got = asyncio.Event()

    async def consume() -> None:
        async with runner.stream(
            _endless([8, 3, 12]), group_size=4, batch_size=6, schedule=schedule
        ) as stream:
            async for _ in stream:
                got.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(30):
        await got.wait()
        while tracker.live == 0:  # the stream goes on rolling out while the consumer works
            await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.live == 0 and runner.stats.live_instances == 0
    assert tracker.peak_live <= 6


async def test_an_endless_input_is_read_lazily_and_no_more_after_close() -> None:
    pulled = 0

    async def tasks() -> AsyncIterator[int]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield i % 3

    runner = TrajectoryRunner(environment=ArithmeticEnv(), backend=ScriptedBackend(lambda r: "0"))
    inputs = tasks()
    async with runner.stream(inputs, group_size=2, batch_size=4, queue_size=2) as stream:
        groups = [await anext(stream) for _ in range(7)]
    assert len(groups) == 7
    assert pulled <= stream.stats.groups_started + 1  # at most one input read ahead
    after = pulled
    pump = stream._source._pump
    assert pump is not None and pump.done()  # nothing reads it once the stream is closed
    assert pulled == after
    assert await anext(inputs) is not None  # the caller's iterator is still the caller's
    assert pulled == after + 1
    await inputs.aclose()


async def test_saved_states_as_inputs_replay_and_pure(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    env = CounterEnv()
    state = await env.reset(6)
    for _ in range(3):
        state = (await env.step(state, Action(text="inc"))).next_state
    replay = TrajectoryRunner(
        environment=env, backend=ScriptedBackend(counter_policy), env_factory=counter_factory()
    )
    async with replay.stream([state, state], group_size=3, batch_size=4) as stream:
        groups = [g async for g in stream]
    assert len(groups) == 2
    for group in groups:
        assert all(t.initial_state.step == 3 and t.success and len(t) == 4 for t in group)
    assert tracker.live == 0

    pure = ArithmeticEnv()
    start = await pure.reset(0)
    runner = TrajectoryRunner(environment=pure, backend=ScriptedBackend(lambda r: "0"))
    async with runner.stream(iter([start]), group_size=2, batch_size=2) as stream:
        (group,) = [g async for g in stream]
    assert [t.initial_state for t in group] == [start, start]


async def test_bad_inputs_and_arguments_are_refused() -> None:
    runner = TrajectoryRunner(environment=ArithmeticEnv(), backend=ScriptedBackend(lambda r: "0"))
    with pytest.raises(ValueError, match="group_size"):
        runner.stream([0], group_size=0, batch_size=1)
    with pytest.raises(ValueError, match="max_staleness"):
        runner.stream([0], group_size=1, batch_size=1, max_staleness=-1)
    with pytest.raises(TypeError, match="inputs"):
        runner.stream(5, group_size=1, batch_size=1)  # type: ignore[arg-type]
    stream = runner.stream([0, 1.5], group_size=1, batch_size=1)  # type: ignore[list-item]
    async with stream:  # a programming error: raised to the consumer, not recorded
        with pytest.raises(TypeError, match=r"inputs\[1\] must be a task.* float 1.5"):
            await _drain(stream)


async def aenumerate(it: AsyncIterator[list[object]]) -> AsyncIterator[tuple[int, list[object]]]:
    i = 0
    async for x in it:
        yield i, x
        i += 1


async def _drain(stream: AsyncIterator[list[object]]) -> None:
    async for _ in stream:
        pass


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_a_producer_error_after_the_consumer_left_is_raised_at_close(
    counter_factory, schedule
) -> None:  # type: ignore[no-untyped-def]
    """The consumer breaks out after one group; a policy bug in a rollout still running
    must not vanish with the stream: closing it raises the bug."""

    def policy(request: GenerationRequest) -> str:
        if request.task == 3 and request.step == 2:
            raise TypeError("bug in the policy")
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=counter_factory()
    )
    async with runner.stream([0, 3], group_size=1, batch_size=2, schedule=schedule) as s:
        (first,) = await anext(s)
        assert first.initial_state.task == 0
        assert s._producer is not None
        await asyncio.wait({s._producer})  # the bug happens while the consumer is away
        assert isinstance(s._producer.exception(), TypeError)
        with pytest.raises(TypeError, match="bug in the policy"):
            await s.aclose()  # the consumer leaves without asking for more
    assert s.closed and runner.stats.live_instances == 0


async def test_an_input_iterator_ignoring_cancellation_does_not_hang_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Closing is bounded by ``close_timeout`` even if the user's async iterator ignores
    the pump's cancellation (the leftover pump is logged)."""
    waiting, release = asyncio.Event(), asyncio.Event()

    async def stubborn() -> AsyncIterator[int]:
        yield 0
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # ignores the cancellation
        await release.wait()

    runner = TrajectoryRunner(
        environment=ArithmeticEnv(), backend=ScriptedBackend(lambda r: "0"), close_timeout=0.05
    )
    with caplog.at_level("WARNING", logger="llenvs_async.runner"):
        async with runner.stream(stubborn(), group_size=1, batch_size=1) as stream:
            await anext(stream)
            await asyncio.wait_for(waiting.wait(), timeout=10)  # the pump is inside it
    assert "stream input iterator still running 0.05s after close" in caplog.text
    pump = stream._source._pump
    assert pump is not None and not pump.done()
    release.set()  # the iterator ends: so does the pump, nothing left behind
    await asyncio.wait_for(asyncio.wait({pump}), timeout=10)
    await stream.aclose()  # idempotent
