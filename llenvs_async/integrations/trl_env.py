"""TRL's ``GRPOTrainer(environment_factory=...)`` over our Harbor instances
(``pip install 'llenvs-async[trl]'``).

::

    from llenvs_async.integrations.trl_env import harbor_environment_factory

    with harbor_environment_factory("examples/tasks", max_steps=20) as environments:
        trainer = GRPOTrainer(model, args=config, environment_factory=environments,
                              train_dataset=Dataset.from_dict(
                                  {"prompt": [[{"role": "user", "content": ""}]] * 2,
                                   "task": ["csv-totals", "log-errors"]}))
        trainer.train()

What TRL 1.16 does with an ``environment_factory`` (read in ``GRPOTrainer.__init__`` and
``_generate_and_score_completions``): it calls the factory with no arguments, keeps the
instances in a pool for the trainer's life (one per rollout of a batch, reused batch after
batch), calls ``instance.reset(**row)`` with the dataset row before each rollout and appends
the string it returns to the row's last user message; every public function of the
instance's class but ``reset`` and ``get_reward`` is a tool, its JSON schema taken from its
signature and docstring; its tool loop calls them synchronously from the trainer's thread
(an exception becomes ``{"error": ...}`` for the model); ``get_reward()`` is read once per
finished rollout as a reward source named after the class (``None``: not scored).

Each ``HarborToolEnvironment`` here is one ``HarborEnvironment`` of the factory's adapter
(persistent shell, the adapter's warm pool, ``runtime="gvisor"``, container limits, the
task's time budget, capped observations): ``reset`` starts the row's task (``row["task"]``,
an index or a name; ``task_field`` renames it) and returns its instruction; the ``bash`` tool
steps the episode with the command as written (the shell keeps its directory and variables);
the ``submit`` tool ends it and runs the verifier; ``get_reward`` is the verifier's reward,
verifying first (``verify_stop``) an episode the trainer stopped without a submit. A failed
start or step is data, per ``failures`` as in ``rollout_func``: ``"exclude"`` (default) scores
the rollout ``None`` (TRL leaves it out of the group baseline), ``"zero"`` scores it 0.0,
``"raise"`` raises.

Teardown (TRL has no close hook): the factory owns one event loop in a daemon thread (the
bridge ``rollout_func`` uses), where the adapter and every instance live.
1. ``close()`` (or leaving ``with``, also when training raises) closes every live instance
   and the adapter (its warm pool, its engine), stops the loop and joins the thread: the plan.
2. An instance TRL drops (the trainer and its pool collected) is closed by its own
   ``weakref.finalize``: its container goes then, without waiting for the factory.
3. The factory's ``weakref.finalize`` runs ``close()`` at interpreter exit; the Docker
   layer's ``atexit`` backstop and ``llenvs-async cleanup`` (owner gone) remain under it.
A container stays up from a rollout's ``reset`` to the instance's next ``reset`` (TRL reads
rewards after generation) or its close.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from llenvs_async import Action, ClosedError, LlenvsError, State, StepResult
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment

from ._bridge import LoopThread
from .trl import _FAILURES, Failures, _require_trl

__all__ = ["HarborToolEnvironment", "TRLHarborEnvironments", "harbor_environment_factory"]

ENDED_TEXT = "The episode has ended ({why}); nothing was run. Stop calling tools."
_STOP_REASON = "rollout_end"  # why a rollout the trainer ended without a submit is verified


def harbor_environment_factory(
    dataset: str | Path,
    *,
    adapter: Callable[[], HarborAdapter] = HarborAdapter,
    max_steps: int | None = 30,
    task_field: str = "task",
    failures: Failures = "exclude",
    close_timeout: float = 60.0,
    **environment: Any,
) -> TRLHarborEnvironments:
    """A ``GRPOTrainer(environment_factory=...)`` over ``dataset``'s Harbor tasks (module docs).

    ``adapter``: makes the ``HarborAdapter`` on the factory's loop (``functools.partial(
    HarborAdapter, warm_pool=8)``, ``runtime="gvisor"``...); ``max_steps`` and
    ``environment`` (``command_timeout_sec``, ``budget_sec``, ``submit_keyword``, ...) go to
    ``adapter.get_environment``. Raises ``TRLUnavailableError`` when TRL is missing.
    """
    _require_trl()
    return TRLHarborEnvironments(
        dataset,
        adapter=adapter,
        max_steps=max_steps,
        task_field=task_field,
        failures=failures,
        close_timeout=close_timeout,
        **environment,
    )


class _Fleet:
    """The adapter and the environments made from it, on the bridge's loop."""

    def __init__(self, adapter: HarborAdapter, dataset: str | Path, options: Mapping[str, Any]):
        self.adapter, self.dataset, self.options = adapter, dataset, options
        self.live: set[HarborEnvironment] = set()

    async def new(self) -> HarborEnvironment:
        env = await self.adapter.get_environment(self.dataset, **self.options)
        self.live.add(env)
        return env

    async def release(self, env: HarborEnvironment) -> None:
        self.live.discard(env)
        await env.aclose()

    async def aclose(self) -> None:
        envs, self.live = list(self.live), set()
        await asyncio.gather(*(env.aclose() for env in envs), return_exceptions=True)


class TRLHarborEnvironments:
    """TRL's ``environment_factory``: each call returns a new ``HarborToolEnvironment``.

    Make it with ``harbor_environment_factory(...)``; close it with ``close()`` or ``with``.
    Pickles as its arguments (``AsyncGRPOTrainer`` sends the factory to its worker process,
    which builds its own loop and adapter there).
    """

    def __init__(
        self,
        dataset: str | Path,
        *,
        adapter: Callable[[], HarborAdapter] = HarborAdapter,
        max_steps: int | None = 30,
        task_field: str = "task",
        failures: Failures = "exclude",
        close_timeout: float = 60.0,
        **environment: Any,
    ) -> None:
        if not callable(adapter):
            raise TypeError(
                f"adapter must be a callable returning a HarborAdapter, got {adapter!r}"
            )
        if not isinstance(task_field, str) or not task_field:
            raise ValueError(f"task_field must be a non-empty string, got {task_field!r}")
        if failures not in _FAILURES:
            raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
        if not close_timeout > 0:
            raise ValueError(f"close_timeout must be > 0 seconds, got {close_timeout!r}")
        self.dataset = dataset
        self.task_field = task_field
        self.failures: Failures = failures
        self._arguments: dict[str, Any] = {
            "adapter": adapter,
            "max_steps": max_steps,
            "task_field": task_field,
            "failures": failures,
            "close_timeout": close_timeout,
            **environment,
        }
        options = {"max_steps": max_steps, **environment}

        @contextlib.asynccontextmanager
        async def fleet() -> AsyncIterator[_Fleet]:
            made = adapter()
            if not isinstance(made, HarborAdapter):
                raise TypeError(f"adapter() must return a HarborAdapter, got {type(made).__name__}")
            async with made:
                crew = _Fleet(made, dataset, options)
                try:
                    yield crew
                finally:
                    await crew.aclose()

        self.bridge: LoopThread[_Fleet] = LoopThread(
            fleet,
            kind=_Fleet,
            owner="TRLHarborEnvironments",
            name="llenvs-trl-environments",
            loop_factory=None,
            close_timeout=close_timeout,
        )
        self._finalizer = weakref.finalize(self, self.bridge.close)

    @property
    def closed(self) -> bool:
        return self.bridge.closed

    def __call__(self) -> HarborToolEnvironment:
        if self.closed:
            raise ClosedError("TRLHarborEnvironments")
        return HarborToolEnvironment(self)

    def close(self) -> None:
        """Close every live instance and the adapter, stop the loop (idempotent)."""
        self._finalizer()

    def __enter__(self) -> Self:
        if self.closed:
            raise ClosedError("TRLHarborEnvironments")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.dataset, self._arguments))


def _rebuild(dataset: str | Path, arguments: dict[str, Any]) -> TRLHarborEnvironments:
    return TRLHarborEnvironments(dataset, **arguments)


class HarborToolEnvironment:
    """One rollout slot of TRL's pool: a Harbor task episode driven by tool calls.

    Public functions are what TRL turns into tools: ``bash`` and ``submit``. ``state`` is the
    episode's ``State`` (history included), ``error`` the failure that ended it (or None).
    """

    def __init__(self, factory: TRLHarborEnvironments) -> None:
        self._factory = factory  # keeps the loop alive while an instance is
        self._bridge = factory.bridge
        self._holder: list[HarborEnvironment] = []
        self.state: State | None = None
        self.error: str | None = None
        self._reward: float | None = None
        self._ended = ""  # why the episode ended, once it has
        # atexit=False: at exit the factory's close covers every instance at once
        finalizer = weakref.finalize(self, _release, self._bridge, self._holder)
        finalizer.atexit = False

    def reset(self, **row: Any) -> str:
        """Start the row's task in a fresh container; its instruction for the prompt."""
        field = self._factory.task_field
        if field not in row:
            raise LlenvsError(
                f"the dataset row has no {field!r} column naming the Harbor task (index or "
                f"name); its columns: {sorted(row)}",
                field=field,
                columns=sorted(row),
            )
        task = row[field]
        if isinstance(task, bool) or not isinstance(task, int | str):
            raise LlenvsError(
                f"row[{field!r}] must be a task index or name, got {task!r}",
                field=field,
                value=task,
            )
        self.state, self.error, self._reward, self._ended = None, None, None, ""
        try:
            self.state = self._bridge.run(self._reset, task)
        except LlenvsError as exc:
            return self._failed(exc)
        return self.state.observation.text

    def bash(self, command: str) -> str:
        """Run a shell command in the task's container and return its output.

        The shell persists between calls: the working directory and environment variables
        stay as the previous command left them.

        Args:
            command: The shell command to run.

        Returns:
            The command's output (stdout and stderr), with its exit code when it failed.
        """
        return self._act(Action(text=command))

    def submit(self) -> str:
        """Submit the task as done: the episode ends and the task's tests run.

        Returns:
            A confirmation that the task was submitted.
        """
        return self._act(Action(text=self._submit_word()))

    def get_reward(self) -> float | None:
        """The verifier's reward of the episode (verified now if it ended without a submit);
        for a failed episode None, 0.0 or an error, per ``failures``."""
        if self.error is not None:
            if self._factory.failures == "raise":
                raise LlenvsError(f"the episode failed: {self.error}", error=self.error)
            return None if self._factory.failures == "exclude" else 0.0
        if self.state is None:
            return None  # never reset: nothing to score
        if self._reward is None:
            try:
                self._reward = self._bridge.run(self._verify, self.state)
            except LlenvsError as exc:
                self._failed(exc)
                return self.get_reward()
        return self._reward

    @property
    def reward(self) -> float | None:
        """``get_reward()``: what TRL's own Harbor reward function reads."""
        return self.get_reward()

    def _act(self, action: Action) -> str:
        if self.error is not None:
            return f"The environment failed: {self.error}. Stop calling tools."
        if self.state is None:
            raise LlenvsError("call reset() before the tools")
        if self.state.done:
            return ENDED_TEXT.format(why=self._ended)
        try:
            result = self._bridge.run(self._step, self.state, action)
        except LlenvsError as exc:
            return self._failed(exc)
        self.state = result.next_state
        text: str = result.next_state.observation.text
        if result.next_state.done:
            self._reward = result.reward
            self._ended = "submitted"
            if not result.next_state.terminated:
                reason = result.info.get("truncation_reason")
                self._ended = f"truncated: {reason}" if reason else "truncated"
                text = f"{text}\n[{ENDED_TEXT.format(why=self._ended)}]"
        return text

    def _failed(self, exc: LlenvsError) -> str:
        if self._factory.failures == "raise":
            raise exc
        self.error = f"{type(exc).__name__}: {exc}"
        return f"The environment failed: {self.error}. Stop calling tools."

    def _submit_word(self) -> str:
        env = self._holder[0] if self._holder else None
        return env.submit_keyword if env is not None else "SUBMIT"

    async def _env(self) -> HarborEnvironment:
        if not self._holder:
            fleet = await self._bridge.get()
            self._holder.append(await fleet.new())
        return self._holder[0]

    async def _reset(self, task: int | str) -> State:
        return await (await self._env()).reset(task)

    async def _step(self, state: State, action: Action) -> StepResult:
        return await (await self._env()).step(state, action)

    async def _verify(self, state: State) -> float:
        verdict = await (await self._env()).verify_stop(state, _STOP_REASON)
        return 0.0 if verdict is None else verdict[0]


def _release(bridge: LoopThread[_Fleet], holder: list[HarborEnvironment]) -> None:
    """An instance's finalizer: close its ``HarborEnvironment`` on the loop (no wait)."""
    if holder:
        env = holder.pop()
        bridge.spawn(_close(bridge, env))


async def _close(bridge: LoopThread[_Fleet], env: HarborEnvironment) -> None:
    fleet = bridge.resource
    if fleet is not None:
        await fleet.release(env)
    else:
        await env.aclose()
