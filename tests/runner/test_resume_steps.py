"""Rollouts resumed from their journaled steps: every settled step reaches ``on_step`` (and a
``StepJournal``), and a rollout cut after any step and resumed from it takes, with the same
seeds, the steps the uncut run took, none repeated (``prefixes``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llenvs_async import GenerationRequest, SamplingParams, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import ChainEnv, CounterEnv
from llenvs_async.serialization import StepJournal, read_journal
from llenvs_async.testing import RecordingBackend
from llenvs_async.types import Trajectory, Transition

SEED = 7


def _sampling(request: GenerationRequest) -> str:
    """A stochastic policy drawing from the request's seed, as a seeded engine does."""
    rng = random.Random(request.seed)
    if request.task is not None and "Counter is" in request.messages[-1].content:
        return rng.choice(["inc", "inc", "dec", "submit"])
    return rng.choice(["left", "right", "right"])


def _runner(kind: str, backend: RecordingBackend) -> TrajectoryRunner:
    params = SamplingParams(seed=SEED)
    if kind == "pure":
        return TrajectoryRunner(ChainEnv(num_tasks=3, max_steps=12), backend, params)

    async def factory() -> CounterEnv:
        return CounterEnv(max_steps=12)

    return TrajectoryRunner(CounterEnv(max_steps=12), backend, params, env_factory=factory)


def _path(t: Trajectory) -> list[tuple[str, float, str]]:
    return [(x.action.text, x.reward, x.next_state.observation.text) for x in t.transitions]


@pytest.mark.parametrize("kind", ["pure", "stateful"])
async def test_a_rollout_cut_after_any_step_resumes_to_the_uncut_trajectory(
    kind: str, tmp_path: Path
) -> None:
    tasks, ids = [0, 1, 2, 0], [0, 1, 5, 2]
    handed: list[tuple[int, int, Transition]] = []
    journal = tmp_path / "steps"
    with StepJournal(journal) as steps:

        def on_step(index: int, step: int, transition: Transition) -> None:
            handed.append((index, step, transition))
            steps.write((tasks[index], ids[index]), step, transition)

        full = await _runner(kind, RecordingBackend(ScriptedBackend(_sampling))).run_batch(
            tasks, rollout_ids=ids, max_steps=8, on_step=on_step
        )
    assert all(t.error is None for t in full)
    assert sum(len(t) for t in full) == len(handed) > 8  # every step, each once
    journaled = read_journal(journal)
    for i, t in enumerate(full):  # the journal holds each whole trajectory
        assert journaled[(tasks[i], ids[i])].transitions == t.transitions

    for i, t in enumerate(full):
        for cut in range(1, len(t) + 1):
            prefix = t.transitions[:cut]
            backend = RecordingBackend(ScriptedBackend(_sampling))
            (resumed,) = await _runner(kind, backend).run_batch_from_states(
                [prefix[-1].next_state], rollout_ids=[ids[i]], max_steps=8, prefixes=[prefix]
            )
            assert resumed.error is None and resumed.info["resumed_at_step"] == cut
            assert _path(resumed) == _path(t) and resumed.stop_reason == t.stop_reason
            assert resumed.initial_state == t.initial_state
            assert sum(backend.batch_sizes) == len(t) - cut  # no step taken twice


async def test_a_step_handed_again_replaces_the_journaled_one_and_a_torn_line_is_dropped(
    tmp_path: Path,
) -> None:
    env = ChainEnv(num_tasks=1, max_steps=12)
    backend = ScriptedBackend(lambda r: "right")
    (t,) = await TrajectoryRunner(env, backend).run_batch([0])
    a, b, c = t.transitions[:3]
    journal = tmp_path / "steps"
    with StepJournal(journal) as steps:
        steps.write(("x", 0), 0, a)
        steps.write(("x", 0), 1, b)
        steps.write(("x", 0), 1, b)  # handed again (a verdict folded in): replaces
        steps.write(("y", 1), 0, a)
        steps.write(("x", 0), 2, c)
    assert read_journal(journal)[("x", 0)].transitions == (a, b, c)
    with StepJournal(journal, read_journal(journal).items()) as steps:
        steps.finished(("y", 1))  # written elsewhere: its state is no longer held
        steps.write(("y", 1), 1, b)  # a later line then carries its state in full
    assert read_journal(journal)[("y", 1)].transitions == (a, b)
    journal.write_text("".join(journal.read_text().splitlines(keepends=True)[:5]))
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-25])  # killed mid-line: that step is lost, nothing misread
    assert read_journal(journal)[("x", 0)].transitions == (a, b)
    # A resumed rollout continues its record against the state its last step led to.
    with StepJournal(journal, read_journal(journal).items()) as steps:
        steps.write(("x", 0), 2, c)
    cut = read_journal(journal)
    assert cut[("x", 0)].transitions == (a, b, c) and cut[("y", 1)].transitions == (a,)
    journal.write_text(journal.read_text() + '{"key": ["z", 0], "step": 3, "transition": {}}\n')
    with pytest.raises(Exception, match=r"steps:6: step 3 of rollout \['z', 0\] follows 0"):
        read_journal(journal)
