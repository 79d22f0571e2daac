from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llenvs_async import GenerationRequest, ScriptedBackend
from llenvs_async.envs import CounterEnv, InstanceTracker
from llenvs_async.testing import RecordingBackend


def counter_policy(request: GenerationRequest) -> str:
    """Reach the target (the task) with ``inc`` then ``submit``."""
    target = request.task
    assert isinstance(target, int)
    last = request.messages[-1].content
    value = int(last.split("Counter is ")[1].split(".")[0])
    return "submit" if value >= target else "inc"


@pytest.fixture
def tracker() -> InstanceTracker:
    return InstanceTracker()


@pytest.fixture
def counter_factory(tracker: InstanceTracker) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        async def factory() -> CounterEnv:
            return CounterEnv(tracker=tracker, **kwargs)

        return factory

    return make


@pytest.fixture
def recording() -> RecordingBackend:
    return RecordingBackend(ScriptedBackend(counter_policy))
