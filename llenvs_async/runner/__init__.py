"""The TrajectoryRunner (lockstep and async schedules), its multi-instance path and its
rollout stream for training loops."""

from __future__ import annotations

from ._config import RunnerStats, StepHook
from ._lockstep import SCHEDULES, Schedule
from ._rollout import PromptBuilder
from ._runner import TrajectoryRunner
from ._stream import RolloutStream, StreamInput, StreamStats

__all__ = [
    "SCHEDULES",
    "PromptBuilder",
    "RolloutStream",
    "RunnerStats",
    "Schedule",
    "StepHook",
    "StreamInput",
    "StreamStats",
    "TrajectoryRunner",
]
