"""The least an asyncio lockstep loop can cost: reset all, then per round one generate and
an ``asyncio.gather`` of the steps. No errors, timeouts, teardown or limits: a floor, not a runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llenvs_async import (
    Action,
    ChatMessage,
    Environment,
    GenerationRequest,
    SamplingParams,
    ScriptedBackend,
    State,
)

__all__ = ["floor_lockstep"]


async def floor_lockstep(
    envs: Sequence[Environment], backend: ScriptedBackend, task: int
) -> list[State]:
    """Run one rollout per environment from ``reset(task)`` to the end; the final states."""
    states = list(await asyncio.gather(*(env.reset(task) for env in envs)))
    messages = [[ChatMessage(role="user", content=s.observation.text)] for s in states]
    active = list(range(len(envs)))
    params = SamplingParams()
    while active:
        requests = [
            GenerationRequest(
                messages=tuple(messages[i]),
                rollout_index=i,
                step=states[i].step,
                task=states[i].task,
            )
            for i in active
        ]
        completions = await backend.generate(requests, params)
        actions = [Action(text=c.text) for c in completions]
        results = await asyncio.gather(
            *(envs[i].step(states[i], a) for i, a in zip(active, actions, strict=True))
        )
        for i, action, result in zip(active, actions, results, strict=True):
            states[i] = result.next_state
            messages[i].append(ChatMessage(role="assistant", content=action.text))
            messages[i].append(ChatMessage(role="user", content=states[i].observation.text))
        active = [i for i in active if not states[i].done]
    await asyncio.gather(*(env.aclose() for env in envs))
    return states
