"""The lockstep loop: per round ONE batched generate call, then every step concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from ..errors import BackendError, ContextLengthError, EnvError, StepTimeoutError
from ..types import Action, GenerationError, Trajectory, Transition
from ._config import RunConfig
from ._instances import close_instances, close_one, prepare
from ._rollout import Rollout, RolloutInput, is_programming_error

__all__ = ["run_chunk"]


async def run_chunk(
    specs: Sequence[RolloutInput], cfg: RunConfig, limit: int
) -> AsyncGenerator[Trajectory, None]:
    """Prepare, run and tear down one chunk, yielding trajectories as rollouts finish.

    No task group is open across a ``yield``: each round's group completes first,
    so abandoning or cancelling the iteration is safe; ``finally`` closes every
    instance still open, shielded and bounded.
    """
    rollouts = [Rollout(spec=spec) for spec in specs]
    cfg.stats.rollouts_started(len(rollouts))
    emitted = 0
    try:
        await _unwrapped_prepare(rollouts, cfg, limit)
        active = [r for r in rollouts if not r.finished]
        finished = [r for r in rollouts if r.finished]
        while True:
            await close_instances(finished, cfg)
            for rollout in finished:
                emitted += 1
                yield _emit(rollout, cfg)
            if not active:
                break
            await _round(active, cfg)
            cfg.stats.rounds += 1
            finished = [r for r in active if r.finished]
            active = [r for r in active if not r.finished]
    finally:
        cfg.stats.active_rollouts -= len(rollouts) - emitted
        await close_instances(rollouts, cfg)


def _emit(rollout: Rollout, cfg: RunConfig) -> Trajectory:
    cfg.stats.active_rollouts -= 1
    if rollout.error is None:
        cfg.stats.completed += 1
    else:
        cfg.stats.failed += 1
    return rollout.trajectory()


async def _unwrapped_prepare(rollouts: Sequence[Rollout], cfg: RunConfig, limit: int) -> None:
    try:
        await prepare(rollouts, cfg, limit)
    except BaseExceptionGroup as group:
        raise _first(group) from None


async def _round(active: Sequence[Rollout], cfg: RunConfig) -> None:
    needing = [r for r in active if r.pending_action is None]
    if needing:
        await _generate(needing, cfg)
    stepping = [r for r in active if not r.finished]
    try:
        # asyncio's TaskGroup: ~3x cheaper per task than anyio's, and this is the hot path.
        async with asyncio.TaskGroup() as tg:
            for rollout in stepping:
                tg.create_task(_step(rollout, cfg))
    except BaseExceptionGroup as group:
        raise _first(group) from None


async def _generate(rollouts: Sequence[Rollout], cfg: RunConfig) -> None:
    """One backend call for every rollout that needs an action. A raised error fails them
    all; a ``GenerationError`` in a request's place fails (or, over the context window,
    stops) that rollout alone.
    """
    base_seed = cfg.sampling_params.seed
    requests = [r.request(cfg.prompt_builder, base_seed) for r in rollouts]
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
    for rollout, completion in zip(rollouts, completions, strict=True):
        if isinstance(completion, GenerationError):
            if isinstance(completion.error, ContextLengthError):
                rollout.stop_reason = "context_length"
            else:
                rollout.fail(completion.error, "generate")
            continue
        rollout.pending_action = Action(text=completion.text, completion=completion)
        rollout.pending_completion = completion


async def _step(rollout: Rollout, cfg: RunConfig) -> None:
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
        await close_one(rollout, cfg)


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first error raised by a task of the runner's own group: a programming error, or
    the exception group holding one that a rollout's environment or backend raised.
    Only the runner's own level is unwrapped: descending into a user's group could pick
    a sibling leaf (an ``OSError``) and hide the programming error beside it.
    """
    return group.exceptions[0]
