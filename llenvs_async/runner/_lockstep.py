"""The lockstep loop: per round ONE batched generate call, then every step concurrently."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Sequence
from typing import Any, Literal

from .._shield import shielded
from ..errors import BackendError, ContextLengthError, EnvError, StepTimeoutError
from ..types import Action, GenerationError, Trajectory, Transition
from ._config import RunConfig
from ._instances import Closer, prepare, prepare_one
from ._rollout import Rollout, RolloutInput, is_programming_error
from ._slots import Slots
from ._tokens import token_mismatch

__all__ = ["Schedule", "run_rollouts"]

_log = logging.getLogger("llenvs_async.runner")


Schedule = Literal["refill", "chunks"]


class _Run:
    """One call's scheduling state: what is pending, preparing, live and closing."""

    def __init__(
        self,
        specs: Sequence[RolloutInput],
        cfg: RunConfig,
        limit: int,
        shared: Slots | None,
    ) -> None:
        self.cfg, self.limit, self.shared = cfg, limit, shared
        self.pending = deque(specs)
        self.started: list[Rollout] = []
        self.active: list[Rollout] = []
        self.new: list[Rollout] = []  # prepared: they join the next round
        self.preparing: dict[asyncio.Task[None], Rollout] = {}
        self.closer = Closer(cfg, on_freed=self.report)

    def live(self) -> int:
        """Rollouts holding (or about to hold) an instance, closing ones included."""
        busy = sum(1 for r in self.active if not r.finished)
        busy += sum(1 for r in self.new if not r.finished)
        return busy + len(self.preparing) + self.closer.closing

    def report(self) -> None:
        if self.shared is not None:
            self.shared.update(id(self), self.live())

    def room(self) -> int:
        free = min(self.limit - self.live(), len(self.pending))
        if self.shared is not None:
            self.report()
            free = min(free, self.shared.free())
        return max(free, 0)

    def take(self, n: int) -> list[Rollout]:
        batch = [Rollout(spec=self.pending.popleft()) for _ in range(n)]
        self.started.extend(batch)
        self.cfg.stats.rollouts_started(n)
        return batch

    def spawn(self) -> None:
        """Start preparing as many pending inputs as there are free slots (background)."""
        loop = asyncio.get_running_loop()
        for rollout in self.take(self.room()):
            task = loop.create_task(prepare_one(rollout, self.cfg, self.closer))
            self.preparing[task] = rollout
        self.report()

    def harvest(self) -> None:
        """Move finished preparations to ``new``; a programming error in one propagates."""
        for task in [t for t in self.preparing if t.done()]:
            rollout = self.preparing.pop(task)
            task.result()
            self.new.append(rollout)

    def room_waits(self) -> list[Coroutine[Any, Any, Any]]:
        """What frees a slot: one of our instances closing, a preparation ending, or
        (shared cap) another run giving slots back."""
        waits: list[Coroutine[Any, Any, Any]] = [self.closer.freed_since(self.closer.freed)]
        running = {t for t in self.preparing if not t.done()}  # a done one wakes nobody again
        if running:
            waits.append(asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED))
        if self.shared is not None:
            waits.append(self.shared.freed_since(self.shared.freed))
        return waits

    async def stop_preparing(self) -> None:
        """Cancel preparations still running. A factory call gets ``close_timeout`` of
        grace to finish (its instance is then closed at once: the closer is shut); this
        waits a little longer than that, and a preparation still running after it is
        logged, not raised (teardown goes on)."""
        self.closer.shut = True
        if not self.preparing:
            return
        for task in self.preparing:
            task.cancel()
        try:
            await shielded(asyncio.wait(set(self.preparing)), within=2 * self.cfg.close_timeout)
        except TimeoutError:
            still = sum(1 for t in self.preparing if not t.done())
            _log.warning("%d rollout preparation(s) still running at teardown", still)
        for task in self.preparing:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the run is ending for another reason
        self.preparing.clear()


async def run_rollouts(
    specs: Sequence[RolloutInput],
    cfg: RunConfig,
    limit: int,
    schedule: Schedule,
    shared: Slots | None = None,
) -> AsyncGenerator[Trajectory, None]:
    """Run every input with at most ``limit`` live rollouts, yielding trajectories as
    rollouts finish.

    ``refill``: a slot freed by a finished rollout (its instance closed) takes the next
    input, prepared in the background while rounds go on; it joins the first round after
    it is ready. ``chunks``: the next ``limit`` inputs start only when the previous ones
    are all done and closed (the seed's behaviour). Each round makes one generate call.
    Finished instances close in the background and keep their slot until closed;
    ``shared`` caps live instances across concurrent runs. No task group is open across
    a ``yield``, so abandoning or cancelling the iteration is safe; ``finally`` stops the
    preparations and closes every instance still open, shielded and bounded.
    """
    run = _Run(specs, cfg, limit, shared)
    emitted = 0
    try:
        while run.pending or run.active or run.preparing:
            if schedule == "chunks":
                await _chunk_step(run)
            else:
                await _refill_step(run)
            running = [*run.active, *run.new]
            run.active, run.new = [r for r in running if not r.finished], []
            for rollout in running:
                if rollout.finished:
                    emitted += 1
                    yield _emit(rollout, cfg)
    finally:
        cfg.stats.active_rollouts -= len(run.started) - emitted
        try:
            await run.stop_preparing()
        finally:
            await run.closer.drain(run.started)
            if shared is not None:
                shared.release(id(run))


async def _chunk_step(run: _Run) -> None:
    if run.active:
        await _round(run.active, run.cfg, run.closer)
        return
    await run.closer.drain()  # the previous chunk is closed before the next one starts
    n = run.room()
    if n == 0:  # every slot is another run's (shared cap)
        await _first_of(run.room_waits())
        return
    run.new = run.take(n)
    run.report()
    await _unwrapped(prepare(run.new, run.cfg, run.closer))


async def _refill_step(run: _Run) -> None:
    """One round for the active rollouts; meanwhile every slot that is or becomes free
    (an instance closed) starts preparing the next input, which joins the first round
    after it is ready. With nothing to step, wait for every preparation in flight."""
    run.spawn()
    if run.active:
        round_task = asyncio.ensure_future(_round(run.active, run.cfg, run.closer))
        try:
            while not round_task.done():
                await _first_of(run.room_waits() if run.pending else [], keep=round_task)
                run.spawn()
        finally:
            if not round_task.done():  # we are being cancelled: so is the round
                round_task.cancel()
                await asyncio.wait({round_task})
        round_task.result()
    elif run.preparing:  # nothing to step: the first round starts with all of them
        await asyncio.wait(set(run.preparing))
    else:  # every slot is closing or another run's
        await _first_of(run.room_waits())
    run.harvest()


async def _first_of(
    waits: Sequence[Coroutine[Any, Any, Any]], keep: asyncio.Future[Any] | None = None
) -> None:
    """Wait until ``keep`` is done or the first of ``waits`` returns; the waits left are
    cancelled (``keep`` is not)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait({*tasks, *([keep] if keep else [])}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _emit(rollout: Rollout, cfg: RunConfig) -> Trajectory:
    cfg.stats.active_rollouts -= 1
    if rollout.error is None:
        cfg.stats.completed += 1
    else:
        cfg.stats.failed += 1
    return rollout.trajectory()


async def _unwrapped(work: Awaitable[None]) -> None:
    try:
        await work
    except BaseExceptionGroup as group:
        raise _first(group) from None


async def _round(active: Sequence[Rollout], cfg: RunConfig, closer: Closer) -> None:
    cfg.stats.rounds += 1
    if cfg.tokens is not None:  # token mode: start prompts of rollouts that just joined
        for rollout in await cfg.tokens.start(active, cfg.system_prompt):
            closer.close(rollout)
    needing = [r for r in active if r.pending_action is None and not r.finished]
    if needing:
        await _generate(needing, cfg)
        for rollout in needing:
            if rollout.finished:  # failed or over the context in generate: its slot frees
                closer.close(rollout)  # only once its instance is closed
    stepping = [r for r in active if not r.finished]
    try:
        # asyncio's TaskGroup: ~3x cheaper per task than anyio's, and this is the hot path.
        async with asyncio.TaskGroup() as tg:
            for rollout in stepping:
                tg.create_task(_step(rollout, cfg, closer))
    except BaseExceptionGroup as group:
        raise _first(group) from None
    if cfg.tokens is not None:  # one batch for the round's new observation turns
        await cfg.tokens.extend(stepping)
        for rollout in stepping:
            if rollout.finished:  # a failed observation turn (idempotent otherwise)
                closer.close(rollout)


async def _generate(rollouts: Sequence[Rollout], cfg: RunConfig) -> None:
    """One backend call for every rollout that needs an action. A raised error fails them
    all; a ``GenerationError`` in a request's place fails (or, over the context window,
    stops) that rollout alone.
    """
    base_seed = cfg.sampling_params.seed
    requests = [r.request(cfg.prompt_builder, base_seed, cfg.tools) for r in rollouts]
    cfg.stats.generate_calls += 1
    try:
        completions = await cfg.backend.generate(requests, cfg.sampling_params)
        if len(completions) != len(requests):
            raise BackendError(
                f"backend returned {len(completions)} completions for {len(requests)} requests"
            )
    except Exception as exc:
        if is_programming_error(exc):
            raise
        for rollout in rollouts:
            rollout.fail(exc, "generate")
        return
    for rollout, request, completion in zip(rollouts, requests, completions, strict=True):
        if isinstance(completion, GenerationError):
            if isinstance(completion.error, ContextLengthError):
                rollout.stop_reason = "context_length"
            else:
                rollout.fail(completion.error, "generate")
            continue
        if cfg.tokens is not None and (mismatch := token_mismatch(completion, request)):
            rollout.fail(mismatch, "generate")
            continue
        rollout.pending_action = Action(
            text=completion.text, tool_calls=completion.tool_calls, completion=completion
        )
        rollout.pending_completion = completion


async def _step(rollout: Rollout, cfg: RunConfig, closer: Closer) -> None:
    env, state, action = rollout.env, rollout.state, rollout.pending_action
    assert env is not None and state is not None and action is not None
    completion, rollout.pending_action, rollout.pending_completion = (
        rollout.pending_completion,
        None,
        None,
    )
    try:
        if cfg.step_timeout is None:
            result = await env.step(state, action)
        else:
            deadline = asyncio.timeout(cfg.step_timeout)
            try:
                async with deadline:
                    result = await env.step(state, action)
            except TimeoutError as exc:
                if deadline.expired():  # ours, not a TimeoutError raised by the step itself
                    raise StepTimeoutError(cfg.step_timeout) from exc
                raise
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # a real cancellation
        # A step that leaks CancelledError without being cancelled would otherwise vanish
        # (a TaskGroup ignores cancelled children) and the rollout would regenerate forever.
        rollout.fail(
            EnvError(f"step raised CancelledError without being cancelled: {exc!r}"), "step"
        )
    except Exception as exc:
        if is_programming_error(exc):
            raise
        rollout.fail(exc, "step")
    else:
        rollout.record(
            Transition(
                state=state,
                action=action,
                next_state=result.next_state,
                reward=result.reward,
                completion=completion,
                info=result.info,
            ),
            ended=result.terminated,
            cut=result.truncated,
            env_max_steps=env.max_steps,
        )
    if rollout.finished:
        closer.close(rollout)  # in the background: the next round does not wait for it


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error raised by a task of the runner's own group: a programming error, or
    the exception group holding one that a rollout's environment or backend raised.
    Only the runner's own level is unwrapped: descending into a user's group could pick
    a sibling leaf (an ``OSError``) and hide the programming error beside it.
    """
    return group.exceptions[0]
