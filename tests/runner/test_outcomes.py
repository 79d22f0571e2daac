"""Per-request outcomes: a GenerationError fails (or, over the context, stops) one rollout only."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from llenvs_async import (
    BackendError,
    Completion,
    ContextLengthError,
    GenerationError,
    GenerationRequest,
    SamplingParams,
    TrajectoryRunner,
)
from llenvs_async.envs import CounterEnv

from .conftest import counter_policy


class _OneBadRequest:
    """Answers like ``counter_policy`` except rollout 1 (a server 400) and rollout 2 (over
    the context window) at their second request."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        self.batches.append(len(requests))
        out: list[Completion | GenerationError] = []
        for i, r in enumerate(requests):
            if r.step == 1 and r.rollout_index == 1:
                out.append(
                    GenerationError(error=BackendError("bad", status_code=400), request_index=i)
                )
            elif r.step == 1 and r.rollout_index == 2:
                out.append(GenerationError(error=ContextLengthError("too long"), request_index=i))
            else:
                out.append(Completion(text=counter_policy(r)))
        return out

    async def aclose(self) -> None:
        return None


async def test_one_failed_request_leaves_its_siblings_complete(counter_factory, tracker) -> None:  # type: ignore[no-untyped-def]
    backend = _OneBadRequest()
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=backend, env_factory=counter_factory()
    )
    trajs = await runner.run_batch([3, 3, 3, 3])
    ok = [trajs[0], trajs[3]]
    assert all(t.success and t.stop_reason == "terminated" for t in ok)
    failed, cut = trajs[1], trajs[2]
    assert failed.stop_reason == "error" and failed.error is not None
    assert failed.error.phase == "generate" and failed.error.details["status_code"] == 400
    assert len(failed) == 1  # the step before the failed request is kept
    # over the context window: an episode outcome, not a framework error
    assert cut.stop_reason == "context_length" and cut.error is None and len(cut) == 1
    assert backend.batches[:2] == [4, 4] and backend.batches[2] == 2  # the round went on
    assert tracker.live == 0


class _Down:
    """A backend that fails: the whole round (``raise_``) or every request on its own."""

    def __init__(self, raise_: bool) -> None:
        self.raise_ = raise_

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        if self.raise_:
            raise BackendError("server down")
        return [GenerationError(error=BackendError("bad")) for _ in requests]

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("schedule", ["refill", "chunks", "async"])
@pytest.mark.parametrize("raise_", [True, False], ids=["round", "per-request"])
async def test_rollouts_failed_in_generate_free_their_slot_only_once_closed(
    counter_factory, tracker, schedule, raise_
) -> None:  # type: ignore[no-untyped-def]
    runner = TrajectoryRunner(
        environment=CounterEnv(), backend=_Down(raise_), env_factory=counter_factory()
    )
    trajs = await runner.run_batch(list(range(1, 9)), batch_size=2, schedule=schedule)
    assert all(t.error is not None and t.error.phase == "generate" for t in trajs)
    assert tracker.peak_live == 2 and runner.stats.peak_live_instances == 2
    assert tracker.live == 0
