"""Getting each rollout an environment in its start state, and guaranteed teardown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import anyio

from ..env import Environment
from ._config import RunConfig
from ._rollout import PROGRAMMING_ERRORS, Rollout

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
    try:
        async with gate:
            if cfg.multi_instance:
                assert cfg.env_factory is not None
                env = await cfg.env_factory()
                rollout.env, rollout.owns_env = env, True
                cfg.stats.instance_opened()
            else:
                rollout.env = cfg.environment
            env = rollout.env
            if spec.state is None:
                phase = "reset"
                state = await env.reset(spec.task, seed=spec.seed)
            elif env.pure_step or spec.state.done:
                state = spec.state
            else:
                phase = "restore"
                cfg.stats.restoring += 1
                cfg.stats.peak_restoring = max(cfg.stats.peak_restoring, cfg.stats.restoring)
                try:
                    async with asyncio.timeout(cfg.restore_timeout):
                        state = await cfg.restore_fn(env, spec.state)
                finally:
                    cfg.stats.restoring -= 1
    except PROGRAMMING_ERRORS:
        raise
    except Exception as exc:
        rollout.fail(exc, phase)
        return
    rollout.start(state, cfg.system_prompt, cfg.max_steps)


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
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + cfg.close_timeout):
            await env.aclose()
    except Exception:
        # Teardown goes on for the other instances; the failure is logged, not raised.
        _log.warning("closing %r failed", env, exc_info=True)
    finally:
        cfg.stats.live_instances -= 1
