"""The lockstep loop: per round ONE batched generate call, then every step concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Iterable, Sequence
from typing import Literal

from .. import _timing
from ..env import VerifiesStops
from ..errors import BackendError, ContextLengthError, EnvError, StepTimeoutError
from ..types import Action, GenerationError, Trajectory, Transition
from ._config import RunConfig
from ._instances import Closer, prepare
from ._rollout import Rollout, is_programming_error
from ._run import Run, first_of
from ._slots import Slots
from ._source import InputSource
from ._tokens import token_mismatch

__all__ = [
    "SCHEDULES",
    "Schedule",
    "generate_actions",
    "run_rollouts",
    "step_rollout",
    "verify_stop",
]

Schedule = Literal["refill", "chunks", "async"]
SCHEDULES: tuple[Schedule, ...] = ("refill", "chunks", "async")


async def run_rollouts(
    source: InputSource,
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
    run = Run(source, cfg, limit, shared)
    try:
        while not source.done or run.active or run.preparing:
            if schedule == "chunks":
                await _chunk_step(run)
            else:
                await _refill_step(run)
            running = [*run.active, *run.new]
            run.active, run.new = [r for r in running if not r.finished], []
            for rollout in running:
                if rollout.finished:
                    yield run.emit(rollout)
    finally:
        await run.end(run.stop_preparing())


async def _chunk_step(run: Run) -> None:
    if run.active:
        await _round(run.active, run.cfg, run.closer)
        return
    await run.closer.drain()  # the previous chunk is closed before the next one starts
    n = run.room()
    if n == 0:  # every slot is another run's (shared cap)
        await first_of(run.room_waits())
        return
    run.new = run.take(n)
    run.report()
    await _unwrapped(prepare(run.new, run.cfg, run.closer))


async def _refill_step(run: Run) -> None:
    """One round for the active rollouts; meanwhile every slot that is or becomes free
    (an instance closed) starts preparing the next input, which joins the first round
    after it is ready. With nothing to step, wait for every preparation in flight."""
    run.spawn()
    if run.active:
        round_task = asyncio.ensure_future(_round(run.active, run.cfg, run.closer))
        try:
            while not round_task.done():
                await first_of(run.room_waits() if not run.source.done else [], keep=round_task)
                run.spawn()
        finally:
            if not round_task.done():  # we are being cancelled: so is the round
                round_task.cancel()
                await asyncio.wait({round_task})
        round_task.result()
    elif run.preparing:  # nothing to step: the first round starts with all of them
        await asyncio.wait(set(run.preparing))
    else:  # every slot is closing or another run's
        await first_of(run.room_waits())
    run.harvest()


async def _unwrapped(work: Awaitable[None]) -> None:
    try:
        await work
    except BaseExceptionGroup as group:
        raise _first(group) from None


async def _round(active: Sequence[Rollout], cfg: RunConfig, closer: Closer) -> None:
    cfg.stats.rounds += 1
    if cfg.tokens is not None:  # token mode: start prompts of rollouts that just joined
        for rollout in await cfg.tokens.start(active, cfg.preamble):
            closer.close(rollout)
    needing = [r for r in active if r.pending_action is None and not r.finished]
    if needing:
        await generate_actions(needing, cfg)
        for rollout in needing:
            if rollout.finished:  # failed or over the context in generate: its slot frees
                closer.close(rollout)  # only once its instance is closed
    stepping = [r for r in active if not r.finished]
    try:
        # asyncio's TaskGroup: ~3x cheaper per task than anyio's, and this is the hot path.
        async with asyncio.TaskGroup() as tg:
            for rollout in stepping:
                tg.create_task(step_rollout(rollout, cfg, closer))
    except BaseExceptionGroup as group:
        raise _first(group) from None
    if cfg.tokens is not None:  # one batch for the round's new observation turns
        await cfg.tokens.extend(stepping)
        for rollout in stepping:
            if rollout.finished:  # a failed observation turn (idempotent otherwise)
                closer.close(rollout)
    hand_steps(stepping, cfg)


async def generate_actions(rollouts: Sequence[Rollout], cfg: RunConfig) -> None:
    """One backend call for every rollout that needs an action. A raised error fails them
    all; a ``GenerationError`` in a request's place fails (or, over the context window,
    stops) that rollout alone.
    """
    base_seed = cfg.sampling_params.seed
    requests = [
        r.request(cfg.prompt_builder, base_seed, cfg.tools, cfg.tool_choice) for r in rollouts
    ]
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
    done = _timing.clock()
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
        rollout.generate_sec = done - rollout.asked  # from ready to ask: batching waits too
    stopped = [r for r in rollouts if r.stop_reason == "context_length"]
    if stopped:
        async with asyncio.TaskGroup() as tg:
            for rollout in stopped:
                tg.create_task(verify_stop(rollout, cfg))


async def step_rollout(rollout: Rollout, cfg: RunConfig, closer: Closer) -> None:
    env, state, action = rollout.env, rollout.state, rollout.pending_action
    assert env is not None and state is not None and action is not None
    completion, rollout.pending_action, rollout.pending_completion = (
        rollout.pending_completion,
        None,
        None,
    )
    generate_sec, rollout.generate_sec = rollout.generate_sec, None
    began = _timing.clock()
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
        rollout.asked = _timing.clock()  # ready to ask for the next action
        rollout.record(
            Transition(
                state=state,
                action=action,
                next_state=result.next_state,
                reward=result.reward,
                completion=completion,
                info=result.info,
            ),
            generate_sec=generate_sec,
            step_sec=rollout.asked - began,
            ended=result.terminated,
            cut=result.truncated,
            env_max_steps=env.max_steps,
            keep_reasoning=cfg.keep_reasoning,
        )
        if rollout.stop_reason == "max_steps":
            await verify_stop(rollout, cfg)
    if rollout.finished:
        closer.close(rollout)  # in the background: the next round does not wait for it


def hand_steps(rollouts: Iterable[Rollout], cfg: RunConfig) -> None:
    """Give ``cfg.on_step`` each rollout's settled steps that it has not had as they now are."""
    hook = cfg.on_step
    if hook is None:
        return
    for rollout in rollouts:
        for step in range(rollout.handed, rollout.length):
            hook(rollout.spec.index, step, rollout.step(step, timed=True))
        rollout.handed = rollout.length


async def verify_stop(rollout: Rollout, cfg: RunConfig) -> None:
    """A stop the runner made (the context window, its ``max_steps``) is verified like the
    environment's own stops by its ``VerifiesStops.verify_stop`` (None: not verified); the
    verdict goes on the last step. A failed verification fails the rollout."""
    env, state = rollout.env, rollout.state
    if not isinstance(env, VerifiesStops) or state is None or state.done:
        return
    reason = rollout.stop_reason
    try:
        async with asyncio.timeout(cfg.step_timeout):
            verdict = await env.verify_stop(state, reason)
    except Exception as exc:
        if is_programming_error(exc):
            raise
        rollout.fail(exc, "verify")
        return
    if verdict is not None:
        reward, info = verdict
        rollout.conclude(reward, {**info, "truncation_reason": reason})


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error raised by a task of the runner's own group: a programming error, or
    the exception group holding one that a rollout's environment or backend raised.
    Only the runner's own level is unwrapped: descending into a user's group could pick
    a sibling leaf (an ``OSError``) and hide the programming error beside it.
    """
    return group.exceptions[0]
