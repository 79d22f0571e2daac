from __future__ import annotations

import re

from .conftest import load_example, run_example

_ESTIMATE = re.compile(r"^(V\(s\)|Q\(s, \w+\))\s+= (-?[\d.]+)\s+95% CI \[(-?[\d.]+), (-?[\d.]+)\]$")


def test_quickstart_prints_estimates_that_rank_the_actions() -> None:
    out = run_example("quickstart.py").stdout
    rows = {
        m[1]: tuple(map(float, m.groups()[1:])) for m in map(_ESTIMATE.match, out.splitlines()) if m
    }
    assert set(rows) == {"V(s)", "Q(s, right)", "Q(s, left)"}
    for mean, low, high in rows.values():
        assert low <= mean <= high
    # walking right from the saved state beats walking left, by non-overlapping intervals
    assert rows["Q(s, left)"][2] < rows["Q(s, right)"][1]
    assert out.startswith("success: [")


def test_training_loop_learns() -> None:
    training = load_example("training_loop.py")
    import asyncio

    rates = asyncio.run(training.train(iterations=15, seed=0, verbose=False))
    assert len(rates) == 15
    start, end = sum(rates[:2]) / 2, sum(rates[-3:]) / 3
    assert start <= 0.45
    assert end >= 0.8
    assert end - start >= 0.4


def test_training_loop_runs_as_a_script_and_reports_progress() -> None:
    out = run_example("training_loop.py").stdout
    lines = [line for line in out.splitlines() if line.startswith("iteration")]
    assert len(lines) == 15
    first, last = re.search(r"success rate: (\d+)% -> (\d+)%", out).groups()  # type: ignore[union-attr]
    assert int(last) - int(first) >= 40


def test_policy_completions_carry_token_ids_and_logprobs() -> None:
    training = load_example("training_loop.py")
    import asyncio
    import math

    from llenvs_async import ChatMessage, GenerationRequest, SamplingParams

    policy = training.SoftmaxPolicy(seed=1)
    request = GenerationRequest(
        messages=(ChatMessage(role="user", content="You are at 2 of 5. Say 'left' or 'right'."),)
    )
    (completion,) = asyncio.run(policy.generate([request], SamplingParams()))
    assert completion.token_ids in ((0,), (1,))
    assert completion.text == training.ACTIONS[completion.token_ids[0]]
    assert completion.logprobs == (math.log(0.5),)


def test_tiny_rl_counts_a_failed_rollout_and_survives_one_without_versions() -> None:
    """A rollout that failed before its first action has no policy versions: the step's
    staleness comes from the others (or is 0), and the failure is counted, not a crash."""
    import asyncio

    from llenvs_async import BackendError, GenerationRequest, ScriptedBackend, TrajectoryRunner
    from llenvs_async.envs import ChainEnv

    example = load_example("train_tiny_rl.py")

    def policy(request: GenerationRequest) -> str:
        if request.rollout_index == 1:
            raise BackendError("engine down")
        return "right"

    runner = TrajectoryRunner(ChainEnv(num_tasks=1, max_steps=3), ScriptedBackend(policy))
    batch = asyncio.run(runner.run_batch([0, 0], batch_size=1))  # one call each
    assert batch[1].error is not None and batch[1].policy_versions == ()
    assert example.staleness_and_failures(batch, 2) == (2, 1)  # versions 0 from rollout 0
    assert example.staleness_and_failures(batch[1:], 2) == (0, 1)
