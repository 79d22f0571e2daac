"""Getting each rollout an environment in its start state, and guaranteed teardown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import anyio

from ..env import Environment
from ..errors import RestoreError
from ._config import RunConfig
from ._rollout import Rollout, is_programming_error

__all__ = ["close_instances", "prepare"]

_log = logging.getLogger("llenvs_async.runner")


async def prepare(rollouts: Sequence[Rollout], cfg: RunConfig, limit: int) -> None:
    """Give every rollout its instance and start state, concurrently, at most ``limit`` at once.

    Pure environments serve every rollout from the one instance (no factory, no
    restore). Otherwise each rollout gets a fresh factory instance (or, without a
    factory, the shared one) restored with ``cfg.restore_fn``. Failures are
    recorded on the rollout; instances are registered before restore so teardown
    finds them even when cancelled mid-restore.
    """
    gate = asyncio.Semaphore(limit) if limit < len(rollouts) else contextlib.nullcontext()
    async with asyncio.TaskGroup() as tg:
        for rollout in rollouts:
            tg.create_task(_prepare_one(rollout, cfg, gate))


async def _prepare_one(
    rollout: Rollout,
    cfg: RunConfig,
    gate: asyncio.Semaphore | contextlib.nullcontext[None],
) -> None:
    spec = rollout.spec
    phase = "factory"
    if spec.state is not None and spec.state.done:
        # Nothing to step: no instance (no container) is needed.
        rollout.start(spec.state, cfg.system_prompt, cfg.max_steps, None)
        return
    try:
        async with gate:
            if cfg.multi_instance:
                assert cfg.env_factory is not None
                await _create(rollout, cfg)
            else:
                rollout.env = cfg.environment
            env = rollout.env
            assert env is not None
            rollout.note_env(env)
            if spec.state is None:
                phase = "reset"
                state = await env.reset(spec.task, seed=spec.seed)
            elif env.pure_step:
                state = spec.state
            else:
                phase = "restore"
                cfg.stats.restoring += 1
                cfg.stats.peak_restoring = max(cfg.stats.peak_restoring, cfg.stats.restoring)
                deadline = asyncio.timeout(cfg.restore_timeout)
                try:
                    async with deadline:
                        state = await cfg.restore_fn(env, spec.state)
                except TimeoutError as exc:
                    if deadline.expired():
                        raise RestoreError(
                            f"restore exceeded restore_timeout={cfg.restore_timeout}s",
                            timeout=cfg.restore_timeout,
                        ) from exc
                    raise
                finally:
                    cfg.stats.restoring -= 1
    except Exception as exc:
        if is_programming_error(exc):
            raise
        rollout.fail(exc, phase)
        return
    rollout.start(state, cfg.system_prompt, cfg.max_steps, env.max_steps)


async def _create(rollout: Rollout, cfg: RunConfig) -> None:
    """Call the factory and register its instance for teardown.

    The factory runs in its own task: when the run is cancelled mid-creation, the
    instance being built (a container already created, say) would be lost half-way
    and never closed. Instead creation may finish, bounded by ``close_timeout``; the
    instance is registered so teardown closes it, then the cancellation goes on.
    """
    assert cfg.env_factory is not None
    creating = asyncio.ensure_future(cfg.env_factory())
    try:
        env = await asyncio.shield(creating)
    except asyncio.CancelledError:
        try:
            with anyio.CancelScope(shield=True):
                await _wait_shielded(creating, cfg.close_timeout)
        finally:
            if creating.done() and not creating.cancelled() and creating.exception() is None:
                rollout.env, rollout.owns_env = creating.result(), True
                cfg.stats.instance_opened()
        raise
    rollout.env, rollout.owns_env = env, True
    cfg.stats.instance_opened()


async def close_instances(rollouts: Sequence[Rollout], cfg: RunConfig) -> None:
    """Close every instance the rollouts own: concurrently, shielded from cancellation,
    bounded by ``cfg.close_timeout``. Close errors never mask the run's outcome.
    """
    owned = [r for r in rollouts if r.owns_env and r.env is not None]
    if not owned:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(cfg.close_timeout):
        async with anyio.create_task_group() as tg:
            for rollout in owned:
                tg.start_soon(close_one, rollout, cfg)


async def close_one(rollout: Rollout, cfg: RunConfig) -> None:
    """Close one rollout's instance (once); a failing ``aclose`` is swallowed, not fatal."""
    env: Environment | None = rollout.env
    if not rollout.owns_env or env is None:
        return
    rollout.env, rollout.owns_env = None, False
    try:
        await _bounded_close(env, cfg.close_timeout)
    except Exception:
        # Teardown goes on for the other instances; the failure is logged, not raised.
        _log.warning("closing %r failed", env, exc_info=True)
    finally:
        cfg.stats.live_instances -= 1


async def _bounded_close(env: Environment, limit: float) -> None:
    """Await ``env.aclose()`` to completion or ``limit`` seconds, whatever cancels the caller.

    anyio's shield only stops anyio's own cancellation; a native ``Task.cancel()`` (an
    ``asyncio.TaskGroup`` cancelling its children, a user cancelling the task) would
    still interrupt ``aclose`` half-way and leak the instance. So the close runs in its
    own task; cancellations of the caller are held back until it ends, then re-raised.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    closer = asyncio.ensure_future(env.aclose())
    try:
        async with asyncio.timeout_at(deadline):
            await asyncio.shield(closer)  # the common path: nobody cancels the caller
        return
    except TimeoutError:
        if closer.done():
            closer.result()  # aclose itself raised TimeoutError: logged by close_one
        closer.add_done_callback(_consume)
        closer.cancel()
        _log.warning("closing %r timed out after %ss", env, limit)
    except asyncio.CancelledError:
        # The caller is being cancelled: let the close finish (bounded), then go on cancelling.
        await _wait_shielded(closer, max(deadline - loop.time(), 0.0))
        raise


async def _wait_shielded(fut: asyncio.Future[Any], limit: float) -> None:
    """Wait until ``fut`` is done, at most ``limit`` seconds (then cancel it), holding back
    cancellations of the caller until then; a held-back cancellation is re-raised.
    """
    fut.add_done_callback(_consume)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    cancelled: asyncio.CancelledError | None = None
    while not fut.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            fut.cancel()
            break
        try:
            await asyncio.wait({fut}, timeout=remaining)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a background future's outcome as seen (callers inspect it when they need it)."""
    if not fut.cancelled():
        fut.exception()
