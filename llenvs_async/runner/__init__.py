"""The lockstep TrajectoryRunner and its multi-instance path."""

from __future__ import annotations

from ._config import RunnerStats
from ._rollout import PromptBuilder
from ._runner import TrajectoryRunner

__all__ = ["PromptBuilder", "RunnerStats", "TrajectoryRunner"]
