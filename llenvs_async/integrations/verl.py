"""verl's agent loop over our environments (``pip install 'llenvs-async[verl]'``).

::

    # agent_loops.yaml, named by actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: llenvs
      _target_: llenvs_async.integrations.verl.LlenvsAgentLoop
      env_factory: my_project.envs:make_env      # async () -> Environment
      max_steps: 16

What verl 0.9 does with an agent loop (read in its ``AgentLoopWorker``): per sample of a
batch it instantiates the registered class (``hydra.utils.instantiate`` of the registry entry,
so the entry's extra keys are constructor keywords) with its ``server_manager`` and tokenizer,
awaits ``run(sampling_params, **sample)`` (``sample``: the dataset row's non-tensor fields,
``raw_prompt``, ``extra_info``, ...), then pads the returned ``AgentLoopOutput`` to
``rollout.prompt_length`` / ``rollout.response_length`` and stacks the batch into a
``DataProto``; ``reward_score`` becomes ``rm_scores`` on the last response token.

``LlenvsAgentLoop.run`` is one rollout of a ``TrajectoryRunner`` in token mode (the runner's
own code path, not a second loop): the environment comes from ``make_environment()`` (by
default the ``env_factory``, an ``EnvFactory`` or a ``"module:attr"`` path to one), the task
from ``task_of(sample)`` (by default ``sample["task"]``, else ``sample["extra_info"]["task"]``),
and every generation goes through verl's ``server_manager.generate`` (``VerlServerBackend``):
token ids in, token ids out, so verl's server does the sampling and the policy's weights
are verl's. The dataset's ``raw_prompt`` is not sent: our start prompt (system prompt, the
environment's first observation, the tokenizer's chat template with the data config's
``apply_chat_template_kwargs``) is what the model sees.

``to_verl`` maps the trajectory (the table in ``docs/trainers.md``): the start prompt, then
every id after it masked by ``TokenRecord.loss_mask``; ``reward_score`` = the return;
``extra_fields`` keep ``stop_reason``, ``truncation_reason``, ``failed``, ``error``.

Budget: the response never exceeds ``rollout.response_length``: each turn's ``max_tokens``
is clamped to what is left of it after the ids so far, and a turn with nothing left stops
the rollout as a context-window stop (``stop_reason="context_length"``, verified by the
environment like any stop the runner makes). A start prompt over ``rollout.prompt_length``
is cut from the left, as verl's own loops do (logged).

Failures are data (``failures``): ``"exclude"`` (default) keeps a failed rollout's ids with
``response_mask`` all 0 and ``reward_score`` 0.0 (verl has no "unscorable" sample: the 0.0
enters the group's baseline, no token of it is trained on); ``"zero"`` keeps its mask;
``"raise"`` raises. A rollout with no ids at all is one pad token of prompt and of response,
masked. verl's server reports ``completed`` for both a stop and ``max_tokens``: a reply as
long as its ``max_tokens`` counts as cut off (``finish_reason="length"``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping
from typing import Any, Literal

from llenvs_async import (
    EnvFactory,
    Environment,
    LlenvsError,
    SamplingParams,
    Trajectory,
    TrajectoryRunner,
)

from .._extras import import_extra
from ._verl_backend import VerlServerBackend, VerlUnavailableError

__all__ = [
    "Failures",
    "LlenvsAgentLoop",  # noqa: F822 (built on first access: module __getattr__)
    "VerlServerBackend",
    "VerlUnavailableError",
    "load_env_factory",
    "sampling_params_of",
    "to_verl",
]

_log = logging.getLogger("llenvs_async.integrations.verl")

Failures = Literal["exclude", "zero", "raise"]
_FAILURES = ("exclude", "zero", "raise")


def sampling_params_of(verl_params: Mapping[str, Any], max_tokens: int) -> SamplingParams:
    """Our ``SamplingParams`` from the dict verl hands ``run`` (greedy in validation, ...)."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(verl_params.get("temperature", 1.0)),
        top_p=float(verl_params.get("top_p", 1.0)),
        top_k=int(verl_params.get("top_k", -1)),
        logprobs=0 if verl_params.get("logprobs") else None,
    )


def to_verl(
    trajectory: Trajectory,
    *,
    pad_token_id: int,
    response_length: int | None = None,
    failures: Failures = "exclude",
) -> dict[str, Any]:
    """The ``AgentLoopOutput`` fields (minus ``metrics``) of one token-mode trajectory
    (module docs); ``response_length`` cuts the response, as verl's loops do."""
    if failures not in _FAILURES:
        raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
    failed = trajectory.error is not None
    error = (
        "" if trajectory.error is None else f"{trajectory.error.type}: {trajectory.error.message}"
    )
    if failed and failures == "raise":
        raise LlenvsError(f"rollout failed (failures='raise'): {error}", error=error)
    record = trajectory.token_record()
    if record is None and not failed:
        raise LlenvsError(
            "the trajectory has no token ids: LlenvsAgentLoop needs token mode "
            "(TrajectoryRunner(..., token_mode=True))"
        )
    if record is None or len(record.input_ids) == record.prompt_length:
        prompt = list(record.input_ids) if record is not None else []
        response, mask = [pad_token_id], [0]
        logprobs: list[float] | None = [0.0]
    else:
        split = record.prompt_length
        prompt = list(record.input_ids[:split])
        response = list(record.input_ids[split:])
        mask = list(record.loss_mask[split:])
        dense = record.dense_logprobs(0.0)
        logprobs = None if dense is None else list(dense[split:])
    if response_length is not None and len(response) > response_length:
        _log.warning("response of %d ids cut to response_length=%d", len(response), response_length)
        response, mask = response[:response_length], mask[:response_length]
        logprobs = None if logprobs is None else logprobs[:response_length]
    if failed and failures == "exclude":
        mask = [0] * len(mask)
    steps = len(trajectory.transitions)
    last_info = trajectory.transitions[-1].info if trajectory.transitions else {}
    return {
        "prompt_ids": prompt or [pad_token_id],
        "response_ids": response,
        "response_mask": mask,
        "response_logprobs": logprobs,
        "reward_score": 0.0 if failed else float(trajectory.total_reward),
        "num_turns": 1 + max(0, 2 * steps - 1),
        "extra_fields": {
            "turn_scores": [float(t.reward) for t in trajectory.transitions],
            "tool_rewards": [],
            "stop_reason": trajectory.stop_reason,
            "truncation_reason": last_info.get("truncation_reason"),
            "failed": failed,
            "error": error or None,
            "num_steps": steps,
        },
    }


def load_env_factory(spec: str | EnvFactory) -> EnvFactory:
    """An ``EnvFactory`` from itself or from a ``"package.module:attribute"`` path."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise LlenvsError(
            f"env_factory must be an async factory or a 'module:attribute' path, got {spec!r}",
            env_factory=repr(spec),
        )
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise LlenvsError(
            f"env_factory {spec!r} cannot be loaded: {type(exc).__name__}: {exc}",
            env_factory=spec,
        ) from exc
    if not callable(factory):
        raise LlenvsError(f"env_factory {spec!r} is not callable", env_factory=spec)
    return factory  # type: ignore[no-any-return]


def _task(value: Any) -> int | str | None:
    """A dataset value as a task (numpy scalars, as verl's non-tensor batch holds them)."""
    value = value.item() if hasattr(value, "item") else value
    if value is None or (isinstance(value, int | str) and not isinstance(value, bool)):
        return value
    raise LlenvsError(f"task {value!r} is not an int, a str or None", task=repr(value))


async def _close(environment: Environment) -> None:
    """Close ``environment`` even when the awaiting task is cancelled meanwhile."""
    closing = asyncio.ensure_future(environment.aclose())
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await closing
        raise


def _require_verl() -> Any:
    """verl's ``agent_loop`` module; ``MissingExtraError`` naming the extra otherwise."""
    return import_extra("verl.experimental.agent_loop.agent_loop", extra="verl",
                        what="llenvs_async.integrations.verl", package="verl")  # fmt: skip


_classes: dict[str, type] = {}


def _agent_loop_class() -> type:
    """``LlenvsAgentLoop``, built on first use so that importing this module imports no verl."""
    if "LlenvsAgentLoop" in _classes:
        return _classes["LlenvsAgentLoop"]
    base = _require_verl()

    class LlenvsAgentLoop(base.AgentLoopBase):  # type: ignore[name-defined,misc]
        """One rollout of our runner per verl sample, generated by verl's server (module docs).

        Keywords (the registry entry's keys): ``env_factory``, ``task_key`` (default
        ``"task"``), ``system_prompt``, ``max_steps``, ``max_tokens_per_turn`` (default:
        ``rollout.response_length``), ``failures``. Override ``make_environment`` or
        ``task_of`` for anything else.
        """

        def __init__(
            self,
            *args: Any,
            env_factory: str | EnvFactory | None = None,
            task_key: str = "task",
            system_prompt: str | None = None,
            max_steps: int | None = None,
            max_tokens_per_turn: int | None = None,
            failures: Failures = "exclude",
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            if failures not in _FAILURES:
                raise ValueError(f"failures must be one of {_FAILURES}, got {failures!r}")
            self.env_factory = None if env_factory is None else load_env_factory(env_factory)
            self.task_key = task_key
            self.system_prompt = system_prompt
            self.max_steps = max_steps
            self.response_length = int(self.rollout_config.response_length)
            self.max_tokens_per_turn = max_tokens_per_turn or self.response_length
            self.failures: Failures = failures

        async def make_environment(self) -> Environment:
            """A fresh environment for one rollout (closed after it)."""
            if self.env_factory is None:
                raise LlenvsError(
                    "LlenvsAgentLoop has no env_factory: set it in the agent loop's registry "
                    "entry or override make_environment()"
                )
            return await self.env_factory()

        def task_of(self, sample: Mapping[str, Any]) -> int | str | None:
            """The task ``reset`` gets: ``sample[task_key]``, else
            ``sample["extra_info"][task_key]``."""
            if self.task_key in sample:
                return _task(sample[self.task_key])
            extra = sample.get("extra_info")
            if isinstance(extra, Mapping) and self.task_key in extra:
                return _task(extra[self.task_key])
            raise LlenvsError(
                f"the sample has no {self.task_key!r} field (nor extra_info[{self.task_key!r}]): "
                f"add it to the dataset or override task_of(); fields: {sorted(sample)}",
                field=self.task_key,
            )

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            task = self.task_of(kwargs)
            backend = VerlServerBackend(
                self.server_manager,
                self.tokenizer,
                response_length=self.response_length,
                extra_sampling_params=sampling_params,
            )
            environment = await self.make_environment()
            try:
                runner = TrajectoryRunner(
                    environment,
                    backend,
                    sampling_params_of(sampling_params, self.max_tokens_per_turn),
                    system_prompt=self.system_prompt,
                    max_steps=self.max_steps,
                    token_mode=True,
                    chat_template_kwargs=dict(self.apply_chat_template_kwargs or {}),
                )
                try:
                    [trajectory] = await runner.run_batch([task])
                finally:
                    await runner.aclose()
            finally:
                await _close(environment)
            if trajectory.error is not None:
                _log.warning("rollout of task %r failed: %s", task, trajectory.error.message)
            fields = to_verl(
                trajectory,
                pad_token_id=_pad_token_id(self.tokenizer),
                response_length=self.response_length,
                failures=self.failures,
            )
            fields["prompt_ids"] = self._cap_text_prompt_length(fields["prompt_ids"])
            timings = [t.info for t in trajectory.transitions]
            metrics = base.AgentLoopMetrics(
                generate_sequences=sum(i.get("generate_sec") or 0.0 for i in timings),
                tool_calls=sum(i.get("step_sec") or 0.0 for i in timings),
            )
            return base.AgentLoopOutput(**fields, metrics=metrics)

    LlenvsAgentLoop.__module__ = __name__
    _classes["LlenvsAgentLoop"] = LlenvsAgentLoop
    return LlenvsAgentLoop


def _pad_token_id(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def __getattr__(name: str) -> Any:
    # ``LlenvsAgentLoop`` subclasses verl's AgentLoopBase: built (importing verl) on first
    # access, so ``hydra`` can locate it by path and this module imports without verl.
    if name == "LlenvsAgentLoop":
        return _agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
