"""Settings and live counters of a runner, shared by its lockstep loop and instance code."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.base import Backend
from ..env import EnvFactory, Environment, RestoreFn
from ..types import ChatMessage, SamplingParams, Transition
from ._rollout import PromptBuilder

if TYPE_CHECKING:
    from ._tokens import TokenPrompts

__all__ = ["COALESCE_WINDOW", "RunConfig", "RunnerStats", "StepHook"]

StepHook = Callable[[int, int, Transition], None]
"""``on_step(index, step, transition)``: rollout ``index`` (its input's position) has taken
step ``step`` of its trajectory (a resumed rollout's prefix counted), settled: its token ids
attached, a stop's verdict folded in. A step changed after it was handed (a later verdict)
is handed again with the same ``step``. What a run journals to resume from."""

# The async schedule holds a ready request this long for others to join its generate call:
# short next to an engine's forward pass (~10-50 ms per decode step on a GPU, more on CPU)
# and a container step (~ms), long enough to catch the requests of steps that end in the
# same burst. It flushes at once when no rollout is stepping, so waits are rarely full.
COALESCE_WINDOW = 0.002


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
    preamble: tuple[ChatMessage, ...]  # the system prompt and example turns, before the task
    prompt_builder: PromptBuilder | None
    max_steps: int | None
    step_timeout: float | None
    restore_timeout: float | None
    close_timeout: float
    stats: RunnerStats
    tokens: TokenPrompts | None = None  # token mode
    tools: tuple[Mapping[str, Any], ...] = ()  # offered to the model on every request
    tool_choice: str | Mapping[str, Any] | None = None
    keep_reasoning: bool = False  # chat mode: re-send earlier turns' reasoning
    coalesce_window: float = COALESCE_WINDOW  # the async schedule's batching window (s)
    on_step: StepHook | None = None

    @property
    def multi_instance(self) -> bool:
        return not self.environment.pure_step and self.env_factory is not None
