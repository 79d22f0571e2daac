"""SkyRL's generator over our runner (``pip install 'llenvs-async[skyrl]'``).

::

    from skyrl.train.entrypoints.main_base import BasePPOExp
    from llenvs_async.integrations.skyrl import skyrl_generator

    class Exp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return skyrl_generator(make_runner(tokenizer), failures="exclude",
                                   overlong_filtering=cfg.generator.apply_overlong_filtering)

What SkyRL 0.3 does with a generator (read in ``RayPPOTrainer.train``/``generate`` and
``generators/base.py``): it awaits ``generate(GeneratorInput)`` with one row per rollout
(each dataset prompt repeated ``n_samples_per_prompt`` times, ``trajectory_ids`` naming the
prompt's uid and the repetition), checks the ``GeneratorOutput`` with
``validate_generator_output``, spreads a row's float reward onto its last response token,
and pads the rows into tensors (``convert_prompts_responses_to_batch_tensors``).

``SkyRLGenerator.generate`` runs one rollout per row through ``runner.run_batch`` (the
runner's own code path; ``token_mode=True``). The task is ``task_of(env_extras)`` (by default
``env_extras["task"]``: a dataset column ``task``); the row's ``prompt`` and ``env_class``
are not used (our start prompt is the environment's first observation under the system
prompt and chat template), nor are SkyRL's ``sampling_params``: the runner's
``SamplingParams`` and backend generate (any token-mode backend: ``VLLMBackend``,
``OpenAIBackend`` against SkyRL's inference endpoint in completions mode, ...).

``to_skyrl`` maps each trajectory: ``prompt_token_ids`` = the start prompt, ``response_ids``
= every id after it, ``loss_masks`` = ``TokenRecord.loss_mask`` over them (1 exactly on
sampled ids; observation turns 0), ``rollout_logprobs`` = the engine's on sampled ids and 0.0
elsewhere (None for the whole batch when a rollout has none: SkyRL takes all or none),
``rewards`` = the trajectory's return (a float per row), ``stop_reasons`` in SkyRL's
vocabulary, where anything but ``"stop"`` is what its overlong filtering masks:

- ``"stop"``: the environment ended the episode (or ``max_steps``, format errors), the last
  reply complete;
- ``"length"``: the last reply was cut at ``max_tokens``, or the prompt outgrew the context
  window (our ``stop_reason="context_length"``);
- ``"error"``: the rollout failed.

``env_metrics`` (one dict per row) keep ours: ``stop_reason``, ``truncation_reason``,
``failed``, ``error``, ``num_steps``; ``rollout_metrics`` adds ``llenvs/avg_failed`` and
``llenvs/avg_num_steps``. Failures (``failures``): ``"exclude"`` (default, SkyRL's own
convention for a failed trajectory) keeps its ids with every loss mask 0 and reward 0.0;
``"zero"`` keeps its mask; ``"raise"`` raises. A rollout with no ids at all is one pad id of
prompt and of response, masked (SkyRL needs a non-empty response).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from llenvs_async import LlenvsError, Trajectory, TrajectoryRunner

from .._extras import import_extra
from ..errors import MissingExtraError

__all__ = [
    "Failures",
    "SkyRLGenerator",
    "SkyRLUnavailableError",
    "skyrl_generator",
    "skyrl_stop_reason",
    "to_skyrl",
]

_log = logging.getLogger("llenvs_async.integrations.skyrl")

Failures = Literal["exclude", "zero", "raise"]
_FAILURES = ("exclude", "zero", "raise")
# The name this module's error had before every extra shared one (kept for ``except`` clauses).
SkyRLUnavailableError = MissingExtraError


def skyrl_generator(
    runner: TrajectoryRunner,
    *,
    task_of: Callable[[Mapping[str, Any]], int | str | None] | None = None,
    failures: Failures = "exclude",
    overlong_filtering: bool = False,
    pad_token_id: int = 0,
    batch_size: int | None = None,
    max_steps: int | None = None,
) -> SkyRLGenerator:
    """A SkyRL ``GeneratorInterface`` over ``runner`` (module docs); raises
    ``SkyRLUnavailableError`` when SkyRL's ``skyrl.train.generators.base`` does not import."""
    base = _require_skyrl()
    base.GeneratorInterface.register(SkyRLGenerator)
    return SkyRLGenerator(
        runner,
        task_of=task_of,
        failures=failures,
        overlong_filtering=overlong_filtering,
        pad_token_id=pad_token_id,
        batch_size=batch_size,
        max_steps=max_steps,
    )


class SkyRLGenerator:
    """``await generate(input_batch) -> GeneratorOutput``: one runner rollout per row.

    A virtual subclass of SkyRL's ``GeneratorInterface`` once ``skyrl_generator`` made one.
    ``last_trajectories`` holds the latest batch's trajectories, in row order.
    """

    def __init__(
        self,
        runner: TrajectoryRunner,
        *,
        task_of: Callable[[Mapping[str, Any]], int | str | None] | None = None,
        failures: Failures = "exclude",
        overlong_filtering: bool = False,
        pad_token_id: int = 0,
        batch_size: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        if not isinstance(runner, TrajectoryRunner):
            raise TypeError(f"runner must be a TrajectoryRunner, got {type(runner).__name__}")
        if failures not in _FAILURES:
            raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
        if task_of is not None and not callable(task_of):
            raise TypeError(f"task_of must be callable, got {task_of!r}")
        self.runner = runner
        self.task_of = task_of
        self.failures: Failures = failures
        self.overlong_filtering = overlong_filtering
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.last_trajectories: list[Trajectory] = []

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        prompts = input_batch["prompts"]
        extras = input_batch.get("env_extras") or [{} for _ in prompts]
        if len(extras) != len(prompts):
            raise LlenvsError(
                f"env_extras has {len(extras)} rows for {len(prompts)} prompts",
                field="env_extras",
            )
        tasks = [self._task(i, extra) for i, extra in enumerate(extras)]
        trajectories = await self.runner.run_batch(tasks, self.batch_size, max_steps=self.max_steps)
        self.last_trajectories = trajectories
        failed = [t for t in trajectories if t.error is not None]
        if failed:
            first = failed[0].error
            assert first is not None
            _log.warning(
                "%d of %d rollouts failed (failures=%r); first: %s: %s",
                len(failed),
                len(trajectories),
                self.failures,
                first.type,
                first.message,
            )
        return to_skyrl(
            trajectories,
            trajectory_ids=input_batch.get("trajectory_ids"),
            pad_token_id=self.pad_token_id,
            failures=self.failures,
            overlong_filtering=self.overlong_filtering,
        )

    def _task(self, row: int, extra: Mapping[str, Any]) -> int | str | None:
        if self.task_of is not None:
            return self.task_of(extra)
        if not isinstance(extra, Mapping) or "task" not in extra:
            raise LlenvsError(
                f"row {row}: env_extras has no 'task' (a dataset column 'task', or pass "
                f"skyrl_generator(..., task_of=...)); got {extra!r}",
                field="env_extras.task",
                index=row,
            )
        task = extra["task"]
        if task is not None and (isinstance(task, bool) or not isinstance(task, int | str)):
            raise LlenvsError(
                f"row {row}: env_extras['task'] must be an int, a str or None, got {task!r}",
                field="env_extras.task",
                value=repr(task),
            )
        return task


def skyrl_stop_reason(trajectory: Trajectory) -> str:
    """Our ending in SkyRL's stop-reason vocabulary (``stop``, ``length``, ``error``)."""
    if trajectory.error is not None:
        return "error"
    if trajectory.stop_reason == "context_length":
        return "length"
    last = trajectory.transitions[-1].completion if trajectory.transitions else None
    return "length" if last is not None and last.finish_reason == "length" else "stop"


def to_skyrl(
    trajectories: Sequence[Trajectory],
    *,
    trajectory_ids: Sequence[Any] | None = None,
    pad_token_id: int = 0,
    failures: Failures = "exclude",
    overlong_filtering: bool = False,
) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` for token-mode ``trajectories``, one row each (module docs).
    ``overlong_filtering`` zeroes the masks of rows whose stop reason is not ``"stop"``
    (SkyRL's ``generator.apply_overlong_filtering``)."""
    if failures not in _FAILURES:
        raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
    if trajectory_ids is not None and len(trajectory_ids) != len(trajectories):
        raise LlenvsError(
            f"trajectory_ids has {len(trajectory_ids)} items for {len(trajectories)} rollouts",
            field="trajectory_ids",
        )
    rows = [_row(t, i, pad_token_id, failures) for i, t in enumerate(trajectories)]
    stops = [skyrl_stop_reason(t) for t in trajectories]
    masks = [
        [0] * len(mask) if overlong_filtering and stop != "stop" else mask
        for (_, _, mask, _), stop in zip(rows, stops, strict=True)
    ]
    logprobs = [lp for _, _, _, lp in rows]
    count = max(len(trajectories), 1)
    return {
        "prompt_token_ids": [prompt for prompt, _, _, _ in rows],
        "response_ids": [response for _, response, _, _ in rows],
        "rewards": [0.0 if t.error is not None else float(t.total_reward) for t in trajectories],
        "loss_masks": masks,
        "stop_reasons": stops,
        "rollout_metrics": {
            "llenvs/avg_failed": sum(t.error is not None for t in trajectories) / count,
            "llenvs/avg_num_steps": sum(len(t.transitions) for t in trajectories) / count,
        },
        "rollout_logprobs": None if any(lp is None for lp in logprobs) else logprobs,
        "trajectory_ids": None if trajectory_ids is None else list(trajectory_ids),
        "trajectory_generation_times": None,
        "rollout_expert_indices": None,
        "is_last_step": None,
        "env_metrics": [_metrics(t) for t in trajectories],
    }


def _row(
    trajectory: Trajectory, position: int, pad_token_id: int, failures: Failures
) -> tuple[list[int], list[int], list[int], list[float] | None]:
    """(prompt ids, response ids, loss mask, logprobs or None) of one rollout."""
    failed = trajectory.error is not None
    if failed and failures == "raise":
        error = trajectory.error
        assert error is not None
        raise LlenvsError(
            f"rollout {position} failed (failures='raise'): {error.type}: {error.message}",
            index=position,
        )
    record = trajectory.token_record()
    if record is None and not failed:
        raise LlenvsError(
            f"rollout {position} has no token ids: the SkyRL generator needs "
            "TrajectoryRunner(..., token_mode=True)",
            index=position,
        )
    if record is None or len(record.input_ids) == record.prompt_length:
        prompt = [] if record is None else list(record.input_ids)
        return prompt or [pad_token_id], [pad_token_id], [0], [0.0]
    split = record.prompt_length
    mask = list(record.loss_mask[split:])
    if failed and failures == "exclude":
        mask = [0] * len(mask)
    dense = record.dense_logprobs(0.0)
    return (
        list(record.input_ids[:split]) or [pad_token_id],
        list(record.input_ids[split:]),
        mask,
        None if dense is None else list(dense[split:]),
    )


def _metrics(trajectory: Trajectory) -> dict[str, Any]:
    error = trajectory.error
    last = trajectory.transitions[-1].info if trajectory.transitions else {}
    return {
        "stop_reason": trajectory.stop_reason,
        "truncation_reason": last.get("truncation_reason"),
        "failed": error is not None,
        "error": None if error is None else f"{error.type}: {error.message}",
        "num_steps": len(trajectory.transitions),
    }


def _require_skyrl() -> Any:
    """SkyRL's ``skyrl.train.generators.base``; ``MissingExtraError`` naming the extra."""
    # SkyRL fails on Python < 3.12 with a pydantic error, not an ImportError: any error counts.
    return import_extra("skyrl.train.generators.base", extra="skyrl", catch_all=True,
                        what="llenvs_async.integrations.skyrl", note=" (Python >= 3.12)",
                        package="SkyRL's generator interface")  # fmt: skip
