"""Environment factories and policies the Ray tests ship to their actors (imported there
by name: the local cluster's nodes get the repository on ``PYTHONPATH``)."""

from __future__ import annotations

from pathlib import Path

from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment
from llenvs_async.envs import CounterEnv
from llenvs_async.errors import VerifierError
from llenvs_async.types import ChatMessage, GenerationRequest, State

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


async def counter() -> CounterEnv:
    return CounterEnv(max_steps=20)


async def slow_counter() -> CounterEnv:
    return CounterEnv(latency=0.05, max_steps=20)


async def slower_counter() -> CounterEnv:
    return CounterEnv(latency=1.0, reset_latency=0.0, max_steps=20)


async def harbor() -> HarborEnvironment:
    return await HarborAdapter().get_environment(EXAMPLES, max_steps=30)


async def failing_factory() -> CounterEnv:
    raise VerifierError("the factory failed on purpose", kind="test")


def counter_policy(request: GenerationRequest) -> str:
    """Reach the target (the task) with ``inc`` then ``submit``."""
    target = request.task
    assert isinstance(target, int)
    value = int(request.messages[-1].content.split("Counter is ")[1].split(".")[0])
    return "submit" if value >= target else "inc"


class VerifiedCounter(CounterEnv):
    """A counter whose runner-made stops are verified: reward 1.0 once it reached 2."""

    async def verify_stop(self, state: State, reason: str) -> tuple[float, dict[str, str]]:
        value = int(state.observation.text.split("Counter is ")[1].split(".")[0])
        return (1.0 if value >= 2 else 0.0), {"verified_because": reason}


async def verified_counter() -> VerifiedCounter:
    return VerifiedCounter(max_steps=20)


class OfferingCounter(CounterEnv):
    """A counter that offers the model everything an ``AgentEnvironment`` can."""

    tools = ({"type": "function", "function": {"name": "inc", "parameters": {}}},)
    system_prompt = "Count up."
    example_turns = (
        ChatMessage(role="user", content="to 1"),
        ChatMessage(role="assistant", content="inc"),
    )
    stop_sequences = ("\nEND",)
    reward_range = (-1.0, 2.0)


async def offering_counter() -> OfferingCounter:
    return OfferingCounter(max_steps=20)
