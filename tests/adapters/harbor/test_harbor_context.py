"""A rollout restored with harbor_restore sends the conversation the original had at that step."""

from __future__ import annotations

import pytest

from llenvs_async import GenerationRequest, ScriptedBackend, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, harbor_restore
from llenvs_async.policies import shell_reply

from .conftest import EXAMPLES

pytestmark = pytest.mark.docker

COMMANDS = ["cd /app && ls", "echo draft > notes.txt", "cat notes.txt", "pwd"]


async def test_restored_harbor_rollout_sends_the_original_messages(adapter: HarborAdapter) -> None:
    sent: dict[int, tuple] = {}  # type: ignore[type-arg]

    def agent(request: GenerationRequest) -> str:
        sent.setdefault(request.step, request.messages)
        return shell_reply(COMMANDS[request.step] if request.step < len(COMMANDS) else "SUBMIT")

    async def factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES, max_steps=10)

    env = await factory()
    try:
        runner = TrajectoryRunner(
            environment=env,
            backend=ScriptedBackend(agent),
            env_factory=factory,
            restore_fn=harbor_restore,
            system_prompt="You are a shell agent.",
        )
        [original] = await runner.run_batch(["csv-totals"])
        assert original.error is None and len(original) == len(COMMANDS) + 1
        k = 3
        saved = original.states[k]
        first: list[tuple] = []  # type: ignore[type-arg]
        runner.backend = ScriptedBackend(lambda r: first.append(r.messages) or "SUBMIT")
        [again] = await runner.run_batch_from_states([saved])
        assert again.error is None
        assert first[0] == sent[k]
        texts = [m.content for m in first[0]]
        # the system prompt, the format's example turns, then the episode as it was
        shown = [m.content for m in env.example_turns]
        assert texts[0] == "You are a shell agent." and texts[1 : 1 + len(shown)] == shown
        episode = texts[1 + len(shown) :]
        assert episode[1] == shell_reply(COMMANDS[0]) and episode[5] == shell_reply(COMMANDS[2])
        assert episode[6] == "draft"  # what `cat notes.txt` showed
        assert len(episode) == 1 + 2 * k
    finally:
        await env.aclose()
