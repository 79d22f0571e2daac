"""What an environment offers the model reaches every request: its action format's stop
sequences (end of reply) and example turns (after the system prompt, before the task)."""

from __future__ import annotations

import pytest

from llenvs_async import ChatMessage, SamplingParams, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import ChainEnv
from llenvs_async.testing._recording import RecordingBackend


class _StoppingChain(ChainEnv):
    stop_sequences = ("\n```\n",)
    system_prompt = "Walk right."
    example_turns = (
        ChatMessage(role="user", content="an example task"),
        ChatMessage(role="assistant", content="right"),
    )


async def test_the_environment_stop_sequences_are_added_after_the_callers() -> None:
    env = _StoppingChain(num_tasks=1, max_steps=2)
    backend = RecordingBackend(ScriptedBackend(lambda request: "right"))
    runner = TrajectoryRunner(env, backend, SamplingParams(stop=("END", "\n```\n"), seed=3))
    await runner.run_batch([0, 0])
    assert backend.params and {p.stop for p in backend.params} == {("END", "\n```\n")}
    plain = TrajectoryRunner(ChainEnv(num_tasks=1), ScriptedBackend(lambda r: "right"))
    assert plain.sampling_params.stop == ()


def test_a_bad_stop_sequence_is_refused_when_the_runner_is_built() -> None:
    env = _StoppingChain(num_tasks=1)
    env.stop_sequences = ("",)  # type: ignore[misc]
    with pytest.raises(TypeError, match="stop_sequences must be non-empty strings"):
        TrajectoryRunner(env, ScriptedBackend(lambda r: "right"))


async def test_example_turns_follow_the_system_prompt_and_go_with_it() -> None:
    backend = RecordingBackend(ScriptedBackend(lambda request: "right"))
    await TrajectoryRunner(_StoppingChain(num_tasks=1, max_steps=1), backend).run_batch([0])
    first = backend.calls[0][0].messages
    assert [(m.role, m.content) for m in first[:3]] == [
        ("system", "Walk right."),
        ("user", "an example task"),
        ("assistant", "right"),
    ]
    assert first[3].role == "user" and first[3].content != "an example task"  # the task
    silent = RecordingBackend(ScriptedBackend(lambda request: "right"))
    runner = TrajectoryRunner(_StoppingChain(num_tasks=1, max_steps=1), silent, system_prompt="")
    await runner.run_batch([0])
    assert [m.role for m in silent.calls[0][0].messages] == ["user"]
