"""The same samples whatever the schedule, with the real engine (per-request seeds)."""

from __future__ import annotations

import pytest

from llenvs_async import TrajectoryRunner
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.envs import ArithmeticEnv
from llenvs_async.types import SamplingParams

from .conftest import Engine

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_async_refill_and_chunks_sample_the_same_trajectories(engine: Engine) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, logprobs=0, seed=5)
    samples = {}
    async with ArithmeticEnv(max_steps=3) as env:
        for schedule in ("async", "refill", "chunks"):
            runner = TrajectoryRunner(env, VLLMBackend(engine.llm), params)
            trajectories = await runner.run_batch(list(range(6)), batch_size=4, schedule=schedule)
            assert all(t.error is None for t in trajectories)
            samples[schedule] = [
                [(x.completion.token_ids if x.completion else (), x.reward) for x in t.transitions]
                for t in trajectories
            ]
    assert samples["async"] == samples["refill"] == samples["chunks"]
    assert len({str(s) for s in samples["async"]}) > 1
