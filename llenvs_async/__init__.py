"""llenvs-async: asyncio-native rollouts for LLM agents, in-process or in real containers.

The public API lives here; everything else is internal (``_private``) or reached
through the sub-packages named in DESIGN.md (``docker``, ``adapters.harbor``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backends.base import Backend, TrainableBackend
from .backends.scripted import ScriptedBackend
from .env import (
    AgentEnvironment,
    BaseEnvironment,
    EnvFactory,
    Environment,
    RestoreFn,
    replay_restore,
)
from .errors import (
    BackendError,
    BackendTimeoutError,
    ClosedError,
    ContainerError,
    ContextLengthError,
    ContinuationPromptError,
    EnvError,
    EstimationError,
    GvisorUnavailableError,
    LlenvsError,
    RestoreError,
    RolloutsFailedError,
    StaleStateError,
    StepTimeoutError,
    TaskLoadError,
)
from .estimation import ValueEstimate, estimate_q_values, estimate_values
from .protocols import AgentProtocol, TextProtocol, ToolsProtocol
from .runner import RolloutStream, StreamStats, TrajectoryRunner
from .types import (
    Action,
    ChatMessage,
    Completion,
    ErrorInfo,
    GenerationError,
    GenerationRequest,
    Observation,
    SamplingParams,
    State,
    StepResult,
    TokenRecord,
    TokenStep,
    ToolReply,
    Trajectory,
    Transition,
)

if TYPE_CHECKING:
    from ._reaper import ReapedOrphans, reap_all_orphans
    from .backends.openai import OpenAIBackend
    from .backends.vllm import VLLMBackend

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AgentEnvironment",
    "AgentProtocol",
    "Backend",
    "BackendError",
    "BackendTimeoutError",
    "BaseEnvironment",
    "ChatMessage",
    "ClosedError",
    "Completion",
    "ContainerError",
    "ContextLengthError",
    "ContinuationPromptError",
    "EnvError",
    "EnvFactory",
    "Environment",
    "ErrorInfo",
    "EstimationError",
    "GenerationError",
    "GenerationRequest",
    "GvisorUnavailableError",
    "LlenvsError",
    "Observation",
    "OpenAIBackend",
    "ReapedOrphans",
    "RestoreError",
    "RestoreFn",
    "RolloutStream",
    "RolloutsFailedError",
    "SamplingParams",
    "ScriptedBackend",
    "StaleStateError",
    "State",
    "StepResult",
    "StepTimeoutError",
    "StreamStats",
    "TaskLoadError",
    "TextProtocol",
    "TokenRecord",
    "TokenStep",
    "ToolReply",
    "ToolsProtocol",
    "TrainableBackend",
    "Trajectory",
    "TrajectoryRunner",
    "Transition",
    "VLLMBackend",
    "ValueEstimate",
    "estimate_q_values",
    "estimate_values",
    "reap_all_orphans",
    "replay_restore",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Lazy: the HTTP and vLLM backends pull in heavier (optional) dependencies.
    if name in ("OpenAIBackend", "VLLMBackend"):
        from . import backends

        return getattr(backends, name)
    if name in ("ReapedOrphans", "reap_all_orphans"):  # the Docker and gVisor layers: on use
        from . import _reaper

        return getattr(_reaper, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
