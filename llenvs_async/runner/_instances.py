"""Getting each rollout an environment in its start state, and guaranteed teardown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from .. import _timing
from .._shield import shielded
from ..env import Environment
from ..errors import EnvError, RestoreError
from ..types import State
from ._config import RunConfig
from ._rollout import Rollout, is_programming_error, with_saved_history

__all__ = ["Closer", "prepare", "prepare_one"]

_log = logging.getLogger("llenvs_async.runner")


async def prepare(rollouts: Sequence[Rollout], cfg: RunConfig, closer: Closer) -> None:
    """Give every rollout its instance and start state, concurrently.

    Pure environments serve every rollout from the one instance (no factory, no
    restore). Otherwise each rollout gets a fresh factory instance (or, without a
    factory, the shared one) restored with ``cfg.restore_fn``. Failures are recorded
    on the rollout; instances are registered with ``closer`` before restore, so
    teardown finds them even when cancelled mid-restore. The caller sizes
    ``rollouts`` to its free slots.
    """
    if len(rollouts) == 1:
        await prepare_one(rollouts[0], cfg, closer)
        return
    async with asyncio.TaskGroup() as tg:
        for rollout in rollouts:
            tg.create_task(prepare_one(rollout, cfg, closer))


async def prepare_one(
    rollout: Rollout, cfg: RunConfig, closer: Closer, *, own_task: bool = False
) -> None:
    """Instance and start state for one rollout (see ``prepare``). ``own_task``: this runs
    in a task only ``Run.stop`` cancels, which lets a factory call finish first."""
    spec = rollout.spec
    phase = "factory"
    rollout.begin()
    if spec.state is not None and spec.state.done:
        # Nothing to step: no instance (no container) is needed.
        rollout.start(spec.state, cfg.preamble, cfg.max_steps, None, cfg.keep_reasoning)
        return
    try:
        if cfg.multi_instance:
            await _create(rollout, cfg, closer, own_task)
            if closer.shut:  # made while the run tears down: already being closed
                return
        else:
            rollout.env = cfg.environment
        env = rollout.env
        assert env is not None
        rollout.note_env(env)
        if spec.state is None:
            phase = "reset"
            began = _timing.clock()
            state = await env.reset(spec.task, seed=spec.seed)
            rollout.restore_sec = _timing.seconds(_timing.clock() - began)
        elif env.pure_step:
            state = spec.state
        else:
            phase = "restore"
            began = _timing.clock()
            state = with_saved_history(await _restore(env, spec.state, cfg), spec.state)
            rollout.restore_sec = _timing.seconds(_timing.clock() - began)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # a real cancellation
        # Leaked by a reset or restore without being cancelled: a failure of this rollout.
        rollout.fail(
            EnvError(f"{phase} raised CancelledError without being cancelled: {exc!r}"), phase
        )
        closer.close(rollout)
        return
    except Exception as exc:
        if is_programming_error(exc):
            raise
        rollout.fail(exc, phase)
        closer.close(rollout)  # a restore that failed: its instance goes at once
        return
    rollout.start(state, cfg.preamble, cfg.max_steps, env.max_steps, cfg.keep_reasoning)
    if rollout.finished:
        closer.close(rollout)  # done before its first round (e.g. over max_steps)


async def _restore(env: Environment, saved: State, cfg: RunConfig) -> State:
    cfg.stats.restoring += 1
    cfg.stats.peak_restoring = max(cfg.stats.peak_restoring, cfg.stats.restoring)
    deadline = asyncio.timeout(cfg.restore_timeout)
    try:
        async with deadline:
            return await cfg.restore_fn(env, saved)
    except TimeoutError as exc:
        if deadline.expired():
            raise RestoreError(
                f"restore exceeded restore_timeout={cfg.restore_timeout}s",
                timeout=cfg.restore_timeout,
            ) from exc
        raise
    finally:
        cfg.stats.restoring -= 1


async def _create(rollout: Rollout, cfg: RunConfig, closer: Closer, own_task: bool) -> None:
    """Call the factory and register its instance for teardown.

    The instance is registered by the factory's own task the moment it exists, so a run
    cancelled mid-creation (a container already created, say) still closes it: creation
    may finish, bounded by ``close_timeout`` once cancelled, then the cancellation goes on.
    """
    assert cfg.env_factory is not None
    factory = cfg.env_factory

    async def create() -> None:
        env = await factory()
        rollout.env, rollout.owns_env = env, True
        closer.opened()
        if closer.shut:  # made after the run began tearing down: nothing else will close it
            closer.close(rollout)

    if not own_task:
        await shielded(create(), within=None, grace=cfg.close_timeout)
        return
    # In its own task the grace is ``Run.stop``'s (it waits for ``creating`` rollouts
    # before cancelling them): no second task per instance.
    rollout.creating = True
    try:
        await create()
    finally:
        rollout.creating = False


class Closer:
    """Closes finished rollouts' instances in the background, off the next round's
    critical path; each close is shielded and bounded by ``close_timeout``. ``drain``
    waits for every close at run end (also when the run is cancelled). A closing
    instance still counts as live: ``closing`` tells the scheduler to keep its slot.
    """

    def __init__(self, cfg: RunConfig, on_freed: Callable[[], None] | None = None) -> None:
        self._cfg = cfg
        self._tasks: set[asyncio.Task[None]] = set()
        self._freed = asyncio.Event()
        self._on_freed = on_freed
        self.freed = 0  # closes ended so far
        self.shut = False  # the run is tearing down: an instance made now is closed at once

    @property
    def closing(self) -> int:
        return len(self._tasks)

    def opened(self) -> None:
        self._cfg.stats.instance_opened()

    def close(self, rollout: Rollout) -> None:
        """Start closing the rollout's instance (once); returns at once."""
        env: Environment | None = rollout.env
        if not rollout.owns_env or env is None:
            return
        rollout.env, rollout.owns_env = None, False
        task = asyncio.get_running_loop().create_task(self._close(env))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def _close(self, env: Environment) -> None:
        # Runs in its own task, which nothing cancels (``drain`` waits, never cancels): no
        # caller's cancellation reaches it, so the timeout alone makes it shielded and
        # bounded, at one task per close instead of two (this is on every rollout's path).
        try:
            async with asyncio.timeout(self._cfg.close_timeout):
                await env.aclose()
        except TimeoutError:
            _log.warning("closing %r timed out after %ss", env, self._cfg.close_timeout)
        except Exception:
            # Teardown goes on for the other instances; the failure is logged, not raised.
            _log.warning("closing %r failed", env, exc_info=True)
        finally:
            self._cfg.stats.live_instances -= 1

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # _close logs its own failures; nothing is left unretrieved
        self.freed += 1
        self._freed.set()
        if self._on_freed is not None:
            self._on_freed()

    async def freed_since(self, seen: int) -> None:
        """Wait until a close ends after the ``freed`` count was ``seen``."""
        while self.freed == seen:
            self._freed.clear()
            await self._freed.wait()

    async def drain(self, rollouts: Sequence[Rollout] = ()) -> None:
        """Close ``rollouts``' instances too, then wait for every close: shielded from
        cancellation, bounded by ``close_timeout`` (each close is bounded by it as well).
        """
        for rollout in rollouts:
            self.close(rollout)
        if not self._tasks:
            return
        try:
            await shielded(asyncio.wait(set(self._tasks)), within=self._cfg.close_timeout)
        except TimeoutError:  # each close already logged its own timeout
            _log.warning(
                "%d instance(s) still closing after %ss", self.closing, self._cfg.close_timeout
            )
