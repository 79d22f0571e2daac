"""Settings and live counters of a runner, shared by its lockstep loop and instance code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend
from ..env import EnvFactory, Environment, RestoreFn
from ..types import SamplingParams
from ._rollout import PromptBuilder

if TYPE_CHECKING:
    from ._tokens import TokenPrompts

__all__ = ["RunConfig", "RunnerStats"]


@dataclass(slots=True)
class RunnerStats:
    """Live counters (for progress displays) and high-water marks (for tests)."""

    live_instances: int = 0
    peak_live_instances: int = 0
    active_rollouts: int = 0
    peak_active_rollouts: int = 0
    restoring: int = 0
    peak_restoring: int = 0
    completed: int = 0
    failed: int = 0
    rounds: int = 0
    generate_calls: int = 0

    def instance_opened(self) -> None:
        self.live_instances += 1
        self.peak_live_instances = max(self.peak_live_instances, self.live_instances)

    def rollouts_started(self, n: int) -> None:
        self.active_rollouts += n
        self.peak_active_rollouts = max(self.peak_active_rollouts, self.active_rollouts)


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything one batch run needs, resolved once from the runner and the call."""

    environment: Environment
    backend: Backend
    sampling_params: SamplingParams
    env_factory: EnvFactory | None
    restore_fn: RestoreFn
    system_prompt: str | None
    prompt_builder: PromptBuilder | None
    max_steps: int | None
    step_timeout: float | None
    restore_timeout: float | None
    close_timeout: float
    stats: RunnerStats
    tokens: TokenPrompts | None = None  # token mode
    tools: tuple[Mapping[str, Any], ...] = ()  # offered to the model on every request

    @property
    def multi_instance(self) -> bool:
        return not self.environment.pure_step and self.env_factory is not None
