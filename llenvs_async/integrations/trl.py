"""TRL's ``GRPOTrainer`` trained on rollouts of our runner (``pip install 'llenvs-async[trl]'``).

::

    from llenvs_async.integrations.trl import environment_reward, rollout_func

    with rollout_func(runner, failures="exclude") as rollouts:       # runner: token_mode=True
        trainer = GRPOTrainer(model, reward_funcs=environment_reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": ["0", "1", "2"]}),
                              rollout_func=rollouts)
        trainer.train()

What TRL 1.16 does with a ``rollout_func`` (read in its ``GRPOTrainer._generate`` and
``_generate_and_score_completions``): it calls ``rollout_func(prompts, trainer)``
synchronously, once per generation batch, with this process's slice of the dataset's
``prompt`` column in which every prompt already appears ``num_generations`` times in a row
(its ``RepeatSampler``); it wants one completion per entry, in order, as a dict of lists:
``prompt_ids``, ``completion_ids`` and ``logprobs`` (required keys), ``env_mask`` (optional:
1 where the loss applies, 0 on tokens the model did not sample), and any other key, which it
hands to the reward functions as a keyword argument (one value per completion). Rewards are
grouped ``num_generations`` at a time for the group baseline; a completion every reward
function scored ``None`` is "unscorable": left out of the group's mean and std and given
advantage 0.

Here each entry is one rollout of the runner (``run_batch``, the runner's own code path, so
``num_generations`` entries of one prompt are its ``num_generations`` rollouts):

- the task: ``task_of(prompt)``; by default the prompt itself, which must then be an ``int``
  or ``str`` the environment's ``reset`` takes (e.g. a dataset whose ``prompt`` column holds
  task ids). Our start prompt (system prompt, the environment's first observation, the
  chat template) is what the model sees, not the dataset's text.
- ``prompt_ids``: the start prompt's token ids; ``completion_ids``: every id after it (the
  sampled actions and the observation turns between them), i.e. ``TokenRecord.input_ids``
  split at ``prompt_length``; ``env_mask``: ``TokenRecord.loss_mask`` over the completion
  (1 exactly on sampled ids); ``logprobs``: one per completion id, the engine's logprob on
  sampled ids (NaN, TRL's "unavailable", when the backend reported none), 0.0 on the
  environment's ids, as TRL's own tool loop writes them.
- extra keys (reward-function kwargs): ``reward`` (what ``environment_reward`` returns),
  ``total_reward`` (the trajectory's return), ``failed``, ``error`` (``"Type: message"``),
  ``stop_reason`` and ``num_steps``: plain values (TRL prints a row's kwargs when no reward
  function scored it). The ``Trajectory`` objects of the latest call, in the same order,
  are ``rollouts.last_trajectories``.

Leave ``SamplingParams.seed`` unset for training: request seeds hash (base seed, position
in the batch, step), so a fixed base seed replays the same seeds in every TRL batch. TRL's
``max_completion_length`` does not cut these completions: the runner's ``max_steps`` and
``SamplingParams.max_tokens`` bound them. Do not pass ``GRPOTrainer(tools=...)``: TRL would
run its own tool loop over the completions and ignore ``env_mask``.

A failed rollout is kept, never dropped (TRL needs one completion per entry), per
``failures``: ``"exclude"`` (default) zeroes its ``env_mask`` and gives it ``reward=None``, so
TRL leaves it out of the group baseline and trains on none of its tokens; ``"zero"`` keeps
its mask and scores it 0.0 like an unsuccessful episode; ``"raise"`` raises. A rollout with
no token ids at all (its reset failed) becomes one pad token of prompt and of completion,
masked. Each batch's failures are counted in the trainer's logs (``llenvs/failed``, the
fraction, logged by ``environment_reward``) and logged as a warning.

Sync and async: TRL's training loop is synchronous; the runner is asyncio. The adapter owns
one event loop in a daemon thread, started when it is made; each call submits the batch to
it and blocks until it is done. A ``KeyboardInterrupt`` (or any error) in the waiting thread
cancels the batch, waits for the runner's teardown (bounded by ``close_timeout``), then
propagates. ``close()`` (or leaving ``with``) cancels what is in flight, exits the runner
factory's context on that loop (engines, containers, clients built there are closed there),
stops the loop and joins the thread; it is idempotent. TRL has no close hook, so a
``weakref.finalize`` does the same when the adapter is garbage-collected or the interpreter
exits (before daemon threads stop): a backstop, not the plan.

Weights: with ``sync_weights="auto"`` (default) and a ``TrainableBackend`` (``VLLMBackend``,
``OpenAIBackend`` against a vLLM server), each call first pushes the trainer's weights when
``trainer.state.global_step`` differs from ``backend.policy_version`` (``mode="wait"``;
backends start at version 0 = the checkpoint both loaded), so completions are tagged with
the step that sampled them. ``"auto"`` skips it when ``GRPOConfig(use_vllm=True)``: TRL then
syncs its own vLLM. A PEFT model is refused (its adapters would need merging first: use
TRL's vLLM route, or ``sync_weights=False``); so is a backend without ``update_weights``
when ``sync_weights=True``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Literal, Self

from llenvs_async import (
    ClosedError,
    LlenvsError,
    TrainableBackend,
    Trajectory,
    TrajectoryRunner,
)

from .._extras import import_extra
from ..errors import MissingExtraError
from ._bridge import LoopThread

__all__ = [
    "Failures",
    "RunnerFactory",
    "TRLRollouts",
    "TRLUnavailableError",
    "environment_reward",
    "rollout_func",
    "to_trl",
]

_log = logging.getLogger("llenvs_async.integrations.trl")

Failures = Literal["exclude", "zero", "raise"]
RunnerFactory = Callable[[], AbstractAsyncContextManager[TrajectoryRunner]]
"""Builds the runner (and its backend and environment) on the adapter's event loop; its
context is exited there by ``close()``."""

_FAILURES = ("exclude", "zero", "raise")
_REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
# The name this module's error had before every extra shared one (kept for ``except`` clauses).
TRLUnavailableError = MissingExtraError


def rollout_func(
    runner: TrajectoryRunner | RunnerFactory,
    *,
    task_of: Callable[[Any], int | str | None] | None = None,
    batch_size: int | None = None,
    max_steps: int | None = None,
    failures: Failures = "exclude",
    sync_weights: bool | Literal["auto"] = "auto",
    close_timeout: float = 60.0,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> TRLRollouts:
    """A ``GRPOTrainer(rollout_func=...)`` that runs ``runner`` in token mode (module docs).

    ``runner``: a ``TrajectoryRunner(token_mode=True)`` whose parts work on any event loop
    (in-process environments, ``ScriptedBackend``; the adapter does not close it), or a
    zero-argument factory of an async context manager yielding one, entered on the
    adapter's loop at the first call and exited by ``close()``: use it for engines,
    containers and HTTP clients, which belong to the loop they were made on.
    ``task_of`` maps a TRL prompt to the task ``reset`` gets (default: the prompt itself).
    ``batch_size`` caps live rollouts (default: the whole batch at once); ``max_steps``
    overrides the runner's. Raises ``TRLUnavailableError`` when TRL is missing.
    """
    _require_trl()
    return TRLRollouts(
        runner,
        task_of=task_of,
        batch_size=batch_size,
        max_steps=max_steps,
        failures=failures,
        sync_weights=sync_weights,
        close_timeout=close_timeout,
        loop_factory=loop_factory,
    )


class TRLRollouts:
    """TRL's ``rollout_func``: ``rollouts(prompts, trainer) -> dict`` (see the module docs).

    Make it with ``rollout_func(...)``; close it with ``close()`` or ``with``.
    ``last_trajectories`` holds the latest batch; ``weight_updates`` counts pushes.
    """

    def __init__(
        self,
        runner: TrajectoryRunner | RunnerFactory,
        *,
        task_of: Callable[[Any], int | str | None] | None = None,
        batch_size: int | None = None,
        max_steps: int | None = None,
        failures: Failures = "exclude",
        sync_weights: bool | Literal["auto"] = "auto",
        close_timeout: float = 60.0,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ) -> None:
        if not isinstance(runner, TrajectoryRunner) and not callable(runner):
            raise TypeError(
                "rollout_func needs a TrajectoryRunner or a factory of an async context "
                f"manager yielding one, got {type(runner).__name__}"
            )
        if task_of is not None and not callable(task_of):
            raise TypeError(f"task_of must be callable, got {task_of!r}")
        for name, value in (("batch_size", batch_size), ("max_steps", max_steps)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if failures not in _FAILURES:
            raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
        if sync_weights not in (True, False, "auto"):
            raise ValueError(f"sync_weights must be True, False or 'auto', got {sync_weights!r}")
        if not close_timeout > 0:
            raise ValueError(f"close_timeout must be > 0 seconds, got {close_timeout!r}")
        self.task_of = task_of
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.failures: Failures = failures
        self.sync_weights = sync_weights
        self.last_trajectories: list[Trajectory] = []
        self.weight_updates = 0
        self._loop: LoopThread[TrajectoryRunner] = LoopThread(
            runner,
            kind=TrajectoryRunner,
            owner="TRLRollouts",
            name="llenvs-trl-rollouts",
            loop_factory=loop_factory,
            close_timeout=close_timeout,
        )
        self._finalizer = weakref.finalize(self, self._loop.close)

    @property
    def closed(self) -> bool:
        return self._loop.closed

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        tasks = [self._task(prompt) for prompt in prompts]
        trajectories = self._loop.run(self._rollouts, tasks, trainer)
        self.last_trajectories = trajectories
        failed = sum(t.error is not None for t in trajectories)
        if failed:
            _log.warning(
                "%d of %d rollouts failed (failures=%r); first: %s",
                failed,
                len(trajectories),
                self.failures,
                _error_text(next(t for t in trajectories if t.error is not None)),
            )
        return to_trl(trajectories, pad_token_id=_pad_token_id(trainer), failures=self.failures)

    def close(self) -> None:
        """Cancel what runs, close what the factory built, stop the loop (idempotent)."""
        self._finalizer()

    def __enter__(self) -> Self:
        if self.closed:
            raise ClosedError("TRLRollouts")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _task(self, prompt: Any) -> int | str | None:
        if self.task_of is not None:
            return self.task_of(prompt)
        if isinstance(prompt, int | str) and not isinstance(prompt, bool):
            return prompt
        raise TypeError(
            f"prompt {prompt!r} is not a task (int or str): pass rollout_func(..., task_of=...) "
            "to map the dataset's prompt column to the environment's tasks"
        )

    async def _rollouts(self, tasks: list[int | str | None], trainer: Any) -> list[Trajectory]:
        runner = await self._loop.get()
        await self._push_weights(runner, trainer)
        return await runner.run_batch(tasks, self.batch_size, max_steps=self.max_steps)

    async def _push_weights(self, runner: TrajectoryRunner, trainer: Any) -> None:
        if self.sync_weights is False:
            return
        backend = runner.backend
        if not isinstance(backend, TrainableBackend):
            if self.sync_weights is True:
                raise LlenvsError(
                    f"sync_weights=True needs a backend with update_weights(); "
                    f"{type(backend).__name__} has none",
                    backend=type(backend).__name__,
                )
            return
        args = getattr(trainer, "args", None)
        if self.sync_weights == "auto" and getattr(args, "use_vllm", False):
            return  # TRL pushes the weights to its own vLLM
        state = getattr(trainer, "state", None)
        step = getattr(state, "global_step", None)
        if not isinstance(step, int) or step == backend.policy_version:
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "peft_config"):
            raise LlenvsError(
                "sync_weights cannot push a PEFT model's adapter weights: merge them into the "
                "model, use GRPOConfig(use_vllm=True), or pass sync_weights=False",
                model=type(model).__name__,
            )
        await backend.update_weights(model.named_parameters(), version=step, mode="wait")
        self.weight_updates += 1


def to_trl(
    trajectories: Sequence[Trajectory], *, pad_token_id: int, failures: Failures = "exclude"
) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` output for token-mode ``trajectories``, one entry each, in order
    (module docs). ``pad_token_id`` fills a failed rollout that has no ids."""
    if failures not in _FAILURES:
        raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
    out: dict[str, list[Any]] = {
        key: []
        for key in (
            *_REQUIRED_KEYS,
            "env_mask",
            "reward",
            "total_reward",
            "failed",
            "error",
            "stop_reason",
            "num_steps",
        )
    }
    for position, trajectory in enumerate(trajectories):
        failed = trajectory.error is not None
        if failed and failures == "raise":
            raise LlenvsError(
                f"rollout {position} failed (failures='raise'): {_error_text(trajectory)}",
                index=position,
                error=_error_text(trajectory),
            )
        prompt, completion, mask, logprobs = _tokens(trajectory, position, pad_token_id)
        if failed and failures == "exclude":
            mask = [0] * len(mask)
        reward: float | None = trajectory.total_reward
        if failed:
            reward = None if failures == "exclude" else 0.0
        out["prompt_ids"].append(prompt)
        out["completion_ids"].append(completion)
        out["logprobs"].append(logprobs)
        out["env_mask"].append(mask)
        out["reward"].append(reward)
        out["total_reward"].append(trajectory.total_reward)
        out["failed"].append(failed)
        out["error"].append(_error_text(trajectory) if failed else None)
        out["stop_reason"].append(trajectory.stop_reason)
        out["num_steps"].append(len(trajectory.transitions))
    return out


def environment_reward(
    *,
    reward: Sequence[float | None] | None = None,
    failed: Sequence[bool] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **_: Any,
) -> list[float | None]:
    """A TRL reward function: the environment's reward of each rollout (the ``reward`` column
    ``rollout_func`` adds; None for an excluded failure). Logs ``llenvs/failed``."""
    if reward is None:
        raise LlenvsError(
            "environment_reward reads the 'reward' column that "
            "llenvs_async.integrations.trl.rollout_func adds: pass GRPOTrainer(rollout_func=...)"
        )
    if log_metric is not None and failed is not None and len(failed):
        log_metric("llenvs/failed", sum(map(bool, failed)) / len(failed))
    return list(reward)


def _tokens(
    trajectory: Trajectory, position: int, pad_token_id: int
) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of one rollout."""
    record = trajectory.token_record()
    if record is None:
        if trajectory.error is None:
            raise LlenvsError(
                f"rollout {position} has no token ids: rollout_func needs "
                "TrajectoryRunner(..., token_mode=True)",
                index=position,
            )
        return [pad_token_id], [pad_token_id], [0], [0.0]
    split = record.prompt_length
    prompt = list(record.input_ids[:split]) or [pad_token_id]
    completion = list(record.input_ids[split:])
    mask = list(record.loss_mask[split:])
    dense = record.dense_logprobs(0.0)
    # a sampled step without logprobs: NaN on every sampled id, TRL's "unavailable"
    logprobs = [math.nan if m else 0.0 for m in mask] if dense is None else list(dense[split:])
    if not completion:  # failed before its first action; TRL needs one id
        return prompt, [pad_token_id], [0], [0.0]
    return prompt, completion, mask, logprobs


def _error_text(trajectory: Trajectory) -> str:
    error = trajectory.error
    return "" if error is None else f"{error.type}: {error.message}"


def _pad_token_id(trainer: Any) -> int:
    """The id TRL pads with (its tokenizer's pad, else eos), for a rollout without ids."""
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _require_trl() -> str:
    """TRL's version; ``MissingExtraError`` naming the extra when it is missing."""
    trl = import_extra("trl", extra="trl", what="llenvs_async.integrations.trl", package="TRL")
    return str(getattr(trl, "__version__", "unknown"))
