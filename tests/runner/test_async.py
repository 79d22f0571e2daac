"""The async schedule: no round barrier, coalesced generate calls, same samples as lockstep."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from llenvs_async import (
    BackendError,
    Completion,
    ContextLengthError,
    GenerationError,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    Trajectory,
    TrajectoryRunner,
)
from llenvs_async.envs import ArithmeticEnv, CounterEnv
from llenvs_async.runner._async import Batcher
from llenvs_async.runner._rollout import Rollout
from llenvs_async.testing import RecordingBackend

from .conftest import counter_policy

SCHEDULES = ("async", "refill", "chunks")


def _targets(n: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [min(int(rng.paretovariate(1.2)), 18) for _ in range(n)]


def _sampled_counter_policy(request: GenerationRequest) -> str:
    """Like ``counter_policy`` but draws ``inc`` or ``add 2`` from the request's seed."""
    if counter_policy(request) == "submit":
        return "submit"
    return random.Random(request.seed).choice(["inc", "add 2"])


class _Asks:
    """Watches the async schedule's batcher: which rollouts' requests are waiting in it."""

    def __init__(self) -> None:
        self.batcher: Batcher | None = None
        self.log: list[int] = []  # rollout indices, one per request queued
        self._changed = asyncio.Event()

    async def until(self, index: int, count: int) -> None:
        """Wait until rollout ``index``'s ``count``-th request is queued in the batcher."""
        while self.log.count(index) < count:
            self._changed.clear()
            await self._changed.wait()

    def waiting(self) -> list[int]:
        assert self.batcher is not None
        return [rollout.spec.index for rollout, _ in self.batcher._waiting]


@pytest.fixture
def asks(monkeypatch: pytest.MonkeyPatch) -> _Asks:
    watch = _Asks()
    original = Batcher.generate

    async def generate(self: Batcher, rollout: Rollout) -> None:
        watch.batcher = self

        def queued() -> None:  # runs once ``generate`` has queued it and waits
            watch.log.append(rollout.spec.index)
            watch._changed.set()

        asyncio.get_running_loop().call_soon(queued)
        await original(self, rollout)

    monkeypatch.setattr(Batcher, "generate", generate)
    return watch


def _key(trajs: Sequence[Trajectory]) -> list[object]:
    return [
        (
            t.index,
            t.stop_reason,
            [(x.action.text, x.next_state.observation.text, x.reward) for x in t.transitions],
        )
        for t in trajs
    ]


async def test_order_cap_and_every_step_generated_once(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    targets = _targets(48)
    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=backend,
        env_factory=counter_factory(latency=0.001, jitter=0.001),
    )
    trajs = await runner.run_batch(targets, batch_size=8, schedule="async")
    assert [t.index for t in trajs] == list(range(48))
    assert all(t.success and len(t) == target + 1 for t, target in zip(trajs, targets, strict=True))
    assert runner.stats.peak_live_instances == 8 and tracker.peak_live == 8
    assert tracker.live == 0 and runner.stats.live_instances == 0
    assert runner.stats.rounds == 0 and runner.stats.generate_calls == len(backend.calls)
    assert sum(backend.batch_sizes) == sum(len(t) for t in trajs) and max(backend.batch_sizes) <= 8


async def test_no_round_barrier_a_slow_step_does_not_hold_the_others(counter_factory) -> None:  # type: ignore[no-untyped-def]
    """Rollout 0's first step waits until rollout 1 has taken 5 more steps: impossible
    with a round barrier (lockstep would wait for the slow step forever)."""
    gate = asyncio.Event()

    class Gated(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if state.task == 9 and state.step == 0:
                await gate.wait()
            return await super()._step(state, action)

    async def factory() -> CounterEnv:
        return Gated()

    def policy(request: GenerationRequest) -> str:
        if request.rollout_index == 1 and request.step == 5:
            gate.set()
        return counter_policy(request)

    backend = RecordingBackend(ScriptedBackend(policy))
    runner = TrajectoryRunner(environment=CounterEnv(), backend=backend, env_factory=factory)
    async with asyncio.timeout(30):
        trajs = await runner.run_batch([9, 8], schedule="async")
    assert all(t.success for t in trajs)
    assert backend.batch_sizes[0] == 2 and 1 in backend.batch_sizes


async def test_requests_ready_together_share_one_call() -> None:
    """Equal steps: every rollout asks at once each time, so each call holds them all."""
    backend = RecordingBackend(ScriptedBackend(lambda request: "0"))
    runner = TrajectoryRunner(environment=ArithmeticEnv(max_steps=3), backend=backend)
    await runner.run_batch(list(range(16)), schedule="async")
    assert backend.batch_sizes == [16, 16, 16]


@pytest.mark.parametrize(("window", "batches"), [(0.0, [2, 1, 1]), (60.0, [2, 2])])
async def test_the_coalescing_window(counter_factory, window, batches, asks) -> None:  # type: ignore[no-untyped-def]
    """Rollout 1's first step lasts until rollout 0's next request waits in the batcher.
    With no window rollout 0 asks alone; with a long one it waits until nobody is stepping
    (rollout 1 asks too), then both go in one call."""

    class SlowFirst(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if state.task == 2 and state.step == 0:
                await asks.until(0, 2)
            return await super()._step(state, action)

    async def factory() -> CounterEnv:
        return SlowFirst()

    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=factory, coalesce_window=window
    )
    trajs = await runner.run_batch([1, 2], schedule="async", max_steps=2)
    assert [len(t) for t in trajs] == [2, 2]
    assert backend.batch_sizes == batches


@pytest.mark.parametrize("env_kind", ["pure", "factory"])
async def test_same_samples_whatever_the_schedule(env_kind: str, counter_factory) -> None:  # type: ignore[no-untyped-def]
    results = {}
    for schedule in SCHEDULES:
        if env_kind == "pure":
            runner = TrajectoryRunner(
                environment=ArithmeticEnv(max_steps=4),
                backend=ScriptedBackend(lambda r: str(random.Random(r.seed).randrange(20))),
                sampling_params=SamplingParams(seed=11),
            )
            trajs = await runner.run_batch(list(range(24)), batch_size=5, schedule=schedule)
        else:
            runner = TrajectoryRunner(
                environment=CounterEnv(),
                backend=ScriptedBackend(_sampled_counter_policy),
                sampling_params=SamplingParams(seed=11),
                env_factory=counter_factory(latency=0.001, jitter=0.002),
            )
            trajs = await runner.run_batch(_targets(24), batch_size=5, schedule=schedule)
        results[schedule] = _key(trajs)
    assert results["async"] == results["refill"] == results["chunks"]
    assert len({str(k) for k in results["async"]}) > 1  # the samples are not all alike


class _Failing:
    """Per rollout: 1 = a server 400 at its 2nd request, 2 = over the context window at
    its 2nd, 3 = the whole generate call holding its 3rd request raises."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        self.batches.append([r.rollout_index for r in requests])
        if any(r.rollout_index == 3 and r.step == 2 for r in requests):
            raise BackendError("server down")
        out: list[Completion | GenerationError] = []
        for i, r in enumerate(requests):
            if r.step == 1 and r.rollout_index == 1:
                out.append(GenerationError(error=BackendError("bad", status_code=400)))
            elif r.step == 1 and r.rollout_index == 2:
                out.append(GenerationError(error=ContextLengthError("too long"), request_index=i))
            else:
                out.append(Completion(text=counter_policy(r)))
        return out

    async def aclose(self) -> None:
        return None


async def test_every_generate_failure_mode_is_recorded(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    backend = _Failing()
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    ok, failed, cut, down, ok2 = await runner.run_batch([1, 3, 3, 3, 1], schedule="async")
    assert ok.success and ok2.success
    assert failed.error is not None and failed.error.phase == "generate"
    assert failed.error.details["status_code"] == 400 and len(failed) == 1
    assert cut.stop_reason == "context_length" and cut.error is None and len(cut) == 1
    assert down.error is not None and down.error.type == "BackendError" and len(down) == 2
    assert backend.batches[-1] == [3]  # the raising call held rollout 3 alone
    assert tracker.live == 0


async def test_step_error_and_step_timeout_are_recorded(tracker) -> None:  # type: ignore[no-untyped-def]
    class Env(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if state.task == 4 and state.step == 1:
                await asyncio.Event().wait()  # hangs: the step timeout ends it
            return await super()._step(state, action)

    async def factory() -> CounterEnv:
        return Env(tracker=tracker, fail_on="submit")

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=factory,
        step_timeout=0.2,
    )
    stepped, hung = await runner.run_batch([1, 4], schedule="async")
    assert stepped.error is not None and stepped.error.phase == "step"
    assert stepped.error.type == "EnvError" and len(stepped) == 1
    assert hung.error is not None and hung.error.type == "StepTimeoutError" and len(hung) == 1
    assert tracker.live == 0


async def test_cancellation_mid_run_leaves_no_instance(tracker) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=0.005, jitter=0.004)

    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(environment=CounterEnv(), backend=backend, env_factory=factory)
    task = asyncio.ensure_future(runner.run_batch(_targets(40), batch_size=6, schedule="async"))
    async with asyncio.timeout(30):
        while runner.stats.completed < 5:
            await asyncio.sleep(0.005)
    assert tracker.live > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tracker.live == 0 and runner.stats.live_instances == 0 and tracker.peak_live <= 6


async def test_a_shared_instance_limit_holds_across_concurrent_async_runs(tracker) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker, latency=0.001)

    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=factory,
        instance_limit=3,
        schedule="async",
    )
    runs = [runner.run_batch(_targets(6, seed=s), batch_size=4) for s in range(4)]
    results = await asyncio.gather(*runs)
    assert all(t.success for trajs in results for t in trajs)
    assert tracker.peak_live == 3 and tracker.live == 0
    assert runner.instance_slots is not None and runner.instance_slots.peak == 3
    assert runner.instance_slots.free() == 3


async def test_a_programming_error_propagates_and_closes_everything(tracker) -> None:  # type: ignore[no-untyped-def]
    async def factory() -> CounterEnv:
        return CounterEnv(tracker=tracker)

    def policy(request: GenerationRequest) -> str:
        if request.rollout_index == 2 and request.step == 2:
            raise TypeError("bug in the policy")
        return counter_policy(request)

    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=ScriptedBackend(policy), env_factory=factory
    )
    with pytest.raises(TypeError, match="bug in the policy"):
        await runner.run_batch([1, 6, 6, 6], schedule="async")
    assert tracker.live == 0


async def test_stream_with_the_async_schedule(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    runner = TrajectoryRunner(
        environment=CounterEnv(),
        backend=ScriptedBackend(counter_policy),
        env_factory=counter_factory(latency=0.001, jitter=0.001),
    )
    async with runner.stream(_targets(12), group_size=3, batch_size=6, schedule="async") as stream:
        groups = [g async for g in stream]
    assert sorted(g[0].index for g in groups) == [3 * i for i in range(12)]
    assert all(t.success for g in groups for t in g) and tracker.live == 0
    assert runner.stats.rounds == 0 and runner.stats.peak_live_instances <= 6


def test_bad_schedule_and_window_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="'refill', 'chunks' or 'async'"):
        TrajectoryRunner(CounterEnv(), ScriptedBackend(counter_policy), schedule="asap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coalesce_window"):
        TrajectoryRunner(CounterEnv(), ScriptedBackend(counter_policy), coalesce_window=-1)


async def test_no_generate_call_is_sent_once_the_run_is_cancelled(tracker, asks) -> None:  # type: ignore[no-untyped-def]
    """Rollout 1 waits in the batcher (long window) while rollout 0's step hangs; the run
    is cancelled: rollout 0's driver ending first must not flush rollout 1's request."""
    stepped = asyncio.Event()

    class Env(CounterEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            if state.task == 2:
                await asyncio.Event().wait()
            result = await super()._step(state, action)
            stepped.set()
            return result

    async def factory() -> CounterEnv:
        return Env(tracker=tracker)

    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=factory, coalesce_window=60
    )
    task = asyncio.ensure_future(runner.run_batch([2, 1], schedule="async"))
    await asyncio.wait_for(stepped.wait(), timeout=10)
    await asyncio.wait_for(asks.until(1, 2), timeout=10)  # rollout 1 asks again
    assert asks.waiting() == [1]  # and waits for its batch-mate
    assert len(backend.calls) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert asks.batcher is not None and asks.batcher.stopped and not asks.batcher.calls
    assert asks.waiting() == []  # withdrawn by its cancelled driver, never sent
    assert len(backend.calls) == 1 and tracker.live == 0


async def test_a_generate_call_outliving_close_timeout_does_not_mask_the_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stubborn engine ignores the call's cancellation past ``close_timeout``: the run
    still ends with the caller's cancellation (the leftover call is logged), not with
    teardown's ``TimeoutError``."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def stubborn(request: GenerationRequest) -> str:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # ignores the cancellation
        await release.wait()
        return "0"

    runner = TrajectoryRunner(
        environment=ArithmeticEnv(max_steps=3),
        backend=ScriptedBackend(stubborn),
        close_timeout=0.05,
    )
    task = asyncio.ensure_future(runner.run_batch([0], schedule="async"))
    await asyncio.wait_for(entered.wait(), timeout=10)
    task.cancel()
    with (
        caplog.at_level("WARNING", logger="llenvs_async.runner"),
        pytest.raises(asyncio.CancelledError),
    ):
        await task
    assert "1 generate call(s) still running at teardown" in caplog.text
    leftover = asyncio.all_tasks() - {asyncio.current_task()}
    assert leftover  # the stubborn call, released now so that the test leaves nothing
    release.set()
    await asyncio.wait(leftover, timeout=10)
    assert all(t.done() for t in leftover)


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_the_offer_is_read_once_per_runner_not_per_rollout_or_stop(schedule: str) -> None:
    """The runner reads an environment's offer once (``AgentSurface.of``); what it checks per
    rollout (``node_id``) and per stop (``verify_stop``) is a narrow type that reads nothing
    else: an instance's ``tools`` and ``example_turns`` are never evaluated."""
    reads: list[str] = []

    class Counted(CounterEnv):
        @property
        def tools(self) -> tuple[()]:
            reads.append("tools")
            return ()

        @property
        def example_turns(self) -> tuple[()]:
            reads.append("example_turns")
            return ()

    async def factory() -> CounterEnv:
        return Counted()

    backend = RecordingBackend(ScriptedBackend(counter_policy))
    runner = TrajectoryRunner(environment=Counted(), backend=backend, env_factory=factory)
    made = len(reads)
    assert set(reads) == {"example_turns", "tools"}
    trajs = await runner.run_batch(_targets(6), batch_size=3, schedule=schedule, max_steps=2)
    assert len(trajs) == 6 and all(t.error is None for t in trajs)
    assert any(t.stop_reason == "max_steps" for t in trajs)  # stops the runner made, verified
    assert len(reads) == made
