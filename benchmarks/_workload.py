"""The simulated workload both sides run: a CounterEnv that logs its latencies, a backend
with a fixed latency per batched call, a policy, and the critical path they imply.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from llenvs_async import Completion, GenerationRequest, SamplingParams, ScriptedBackend
from llenvs_async.envs import CounterEnv

__all__ = ["LatencyBackend", "LoggedCounterEnv", "counting_policy", "critical_path"]


def counting_policy(request: GenerationRequest) -> str:
    """Counter task ``t``: ``inc`` until step ``t``, then ``submit`` (``t + 1`` steps)."""
    assert isinstance(request.task, int)
    return "submit" if request.step >= request.task else "inc"


class _DrawLog(random.Random):
    """A Random that remembers its ``uniform`` draws (the jitter CounterEnv adds)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        value = super().uniform(a, b)
        self.draws.append(value)
        return value


class LoggedCounterEnv(CounterEnv):
    """CounterEnv (same latency model) that logs every simulated I/O delay it sleeps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rng = self._log = _DrawLog(self.ident)
        self._bases: list[float] = []

    async def _io(self, what: str, base: float) -> None:
        self._bases.append(base)
        await super()._io(what, base)

    @property
    def delays(self) -> list[float]:
        """Seconds each reset/step slept, in order (the reset first)."""
        draws = self._log.draws if self.jitter else [0.0] * len(self._bases)
        assert len(draws) == len(self._bases), "CounterEnv no longer draws one jitter per I/O"
        return [max(base + d, 0.0) for base, d in zip(self._bases, draws, strict=True)]


class LatencyBackend(ScriptedBackend):
    """ScriptedBackend whose every batched ``generate`` call takes ``latency`` seconds,
    whatever the batch size (a GPU batch at fixed cost).
    """

    def __init__(self, latency: float) -> None:
        super().__init__(counting_policy)
        self.latency = latency

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        await asyncio.sleep(self.latency)
        return await super().generate(requests, params)


def critical_path(delays: Sequence[Sequence[float]], generate_latency: float) -> float:
    """Ideal wall time of a lockstep batch: the slowest reset, then per round one
    generate plus the slowest step. ``delays[i]`` is rollout i's reset then step delays.
    """
    rounds = max(len(d) for d in delays)
    slowest = [max((d[r] for d in delays if r < len(d)), default=0.0) for r in range(rounds)]
    return slowest[0] + sum(generate_latency + s for s in slowest[1:])
