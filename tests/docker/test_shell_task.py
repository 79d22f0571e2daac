"""The agent protocol in a real container: realistic replies (reasoning with decoy blocks,
prose, cut-off replies, parallel tool calls, bad calls), format errors ending a rollout, and
every stop the runner makes verified (the context window after a correct step scores 1.0).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from llenvs_async import Action, Completion, GenerationRequest, TrajectoryRunner
from llenvs_async.docker import DockerEngine, DockerEnvironment
from llenvs_async.errors import ContextLengthError
from llenvs_async.types import GenerationError, SamplingParams

pytestmark = pytest.mark.docker

# Passes only when the answer ran and nothing a decoy, a cut-off reply or a late call held did.
VERIFY = "test -f /tmp/out && ! test -e /tmp/decoy && ! test -e /tmp/cut && ! test -e /tmp/late"


def call(name: str, arguments: str | dict[str, Any], call_id: str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


class Replies:
    """A backend answering step ``n`` of every rollout with ``replies[n]`` (a completion or
    a per-request error), recording every request it was sent."""

    def __init__(self, replies: Sequence[Completion | Callable[[], GenerationError]]) -> None:
        self.replies = replies
        self.requests: list[GenerationRequest] = []

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        self.requests.extend(requests)
        out: list[Completion | GenerationError] = []
        for request in requests:
            reply = self.replies[request.step]
            out.append(reply if isinstance(reply, Completion) else reply())
        return out

    async def aclose(self) -> None:
        return None


def text(reply: str, finish_reason: str = "stop", reasoning: str | None = None) -> Completion:
    return Completion(text=reply, finish_reason=finish_reason, reasoning=reasoning)


def tools(*calls: dict[str, Any], content: str = "") -> Completion:
    return Completion(text=content, tool_calls=calls, finish_reason="tool_calls")


def over_the_window() -> GenerationError:
    return GenerationError(error=ContextLengthError("prompt of 9000 tokens > 8192"))


@pytest.fixture
def make_env(engine: DockerEngine, busybox_image: str) -> Callable[..., Callable[[], Any]]:
    def make(**kwargs: Any) -> Any:
        return DockerEnvironment.factory(
            image=busybox_image, engine=engine, verify_command=VERIFY, **kwargs
        )

    return make


async def run_one(
    make_env: Callable[..., Any], backend: Any, max_steps: int | None = None, **env: Any
) -> Any:
    factory = make_env(**env)
    prototype = await factory()
    async with prototype:
        runner = TrajectoryRunner(prototype, backend, env_factory=factory, max_steps=max_steps)
        [trajectory] = await runner.run_batch([None])
    return trajectory


async def test_text_replies_as_reasoning_models_write_them(make_env: Any) -> None:
    backend = Replies(
        [
            # Qwen3: the template opened <think>; the reasoning holds a decoy block.
            text(
                "Maybe:\n```bash\ntouch /tmp/decoy\n```\nNo.</think>\n\n"
                "```bash\necho 1 > /tmp/out\n```"
            ),
            text("I'll list the files in /tmp now."),  # prose: never reaches the shell
            text("```bash\ntouch /tmp/cut\n```", finish_reason="length"),  # cut off
            text("<think>done?\n```bash\ntouch /tmp/decoy\n```\n</think>\n\nSUBMIT"),
        ]
    )
    trajectory = await run_one(make_env, backend)
    assert trajectory.error is None, trajectory.error
    infos = [t.info for t in trajectory.transitions]
    assert infos[0]["command"] == "echo 1 > /tmp/out" and infos[0]["parse_error"] is None
    assert infos[1]["parse_error"] and "command" not in infos[1]
    assert "length" in infos[2]["parse_error"] and infos[2]["finish_reason"] == "length"
    assert "command" not in infos[2]
    assert infos[3]["submitted"] is True
    assert trajectory.total_reward == 1.0 and trajectory.stop_reason == "terminated"
    # The model was told what went wrong, as a user turn, and the format errors counted.
    second = backend.requests[2].messages
    assert second[-1].role == "user" and "```" in second[-1].content
    assert [i.get("format_errors") for i in infos] == [None, 1, 2, None]


async def test_consecutive_format_errors_end_the_rollout_verified(make_env: Any) -> None:
    backend = Replies(
        [text("```bash\necho 1 > /tmp/out\n```"), *[text("Let me think about it.")] * 5]
    )
    trajectory = await run_one(make_env, backend, max_format_errors=3)
    assert len(trajectory) == 4 and trajectory.stop_reason == "truncated"
    last = trajectory.transitions[-1].info
    assert last["truncation_reason"] == "format_errors" and last["format_errors"] == 3
    assert trajectory.total_reward == 1.0  # the container holds the answer: verified


async def test_parallel_tool_calls_run_in_order_and_every_call_is_answered(
    make_env: Any,
) -> None:
    backend = Replies(
        [
            tools(
                call("bash", {"command": "echo 1 > /tmp/out"}, "c1"),
                call("bash", '{"command": "touch /tmp/decoy"', "c2"),  # malformed JSON
                call("python", {"code": "1"}, "c3"),  # unknown tool
                call("bash", {"command": "sleep 5; touch /tmp/decoy", "timeout_sec": 1}, "c4"),
            ),
            tools(content="I am done."),  # no call: a format error
            tools(call("submit", {}, "c5"), call("bash", {"command": "touch /tmp/late"}, "c6")),
        ],
    )
    trajectory = await run_one(make_env, backend, action_format="tools")
    assert trajectory.error is None, trajectory.error
    assert trajectory.total_reward == 1.0 and trajectory.stop_reason == "terminated"
    request = backend.requests[1]
    names = [t["function"]["name"] for t in request.tools]
    assert sorted(names) == ["bash", "submit"]
    replies = [m for m in request.messages if m.role == "tool"]
    assert [m.tool_call_id for m in replies] == ["c1", "c2", "c3", "c4"]
    assert "error" in replies[1].content and "error" in replies[2].content
    assert "timed out after 1s" in replies[3].content
    first = trajectory.transitions[0].info
    ran = [c["command"] for c in first["calls"]]
    assert ran == ["echo 1 > /tmp/out", "sleep 5; touch /tmp/decoy"]
    assert trajectory.transitions[1].info["parse_error"]
    assert backend.requests[2].messages[-1].role == "user"


async def test_a_command_written_by_hand_is_shown_as_a_tool_call(
    busybox_image: str, engine: DockerEngine
) -> None:
    async with DockerEnvironment(image=busybox_image, engine=engine, action_format="tools") as env:
        state = await env.reset()
        forced = Action(text="echo forced")
        result = await env.step(state, forced)
        assert result.next_state.actions[-1] == forced  # the state keeps what was taken
        data = result.next_state.observation.data
        [tool_call] = data["shown_action"]["tool_calls"]  # shown to the model as a call
        assert json.loads(tool_call["function"]["arguments"]) == {"command": "echo forced"}
        [reply] = result.next_state.observation.tool_replies
        assert (reply.tool_call_id, reply.content) == (tool_call["id"], "forced")
        # What the model saw parses to the same command.
        seen = Action(text="", tool_calls=(tool_call,))
        assert env.commands(seen) == env.commands(forced) == ("echo forced",)


async def test_the_context_window_after_a_correct_step_is_verified(make_env: Any) -> None:
    backend = Replies([text("```bash\necho 1 > /tmp/out\n```"), over_the_window])
    trajectory = await run_one(make_env, backend)
    assert trajectory.stop_reason == "context_length" and trajectory.error is None
    assert len(trajectory) == 1 and trajectory.total_reward == 1.0
    last = trajectory.transitions[-1]
    assert last.info["truncation_reason"] == "context_length"
    assert last.next_state.truncated


async def test_the_runners_max_steps_stop_is_verified(make_env: Any) -> None:
    backend = Replies([text("```bash\necho 1 > /tmp/out\n```")] * 3)
    cut = await run_one(make_env, backend, max_steps=2)
    assert cut.stop_reason == "max_steps" and len(cut) == 2
    assert cut.total_reward == 1.0
    assert cut.transitions[-1].info["truncation_reason"] == "max_steps"


async def test_a_servers_context_window_400_after_a_correct_step_still_scores(
    make_env: Any,
) -> None:
    """Over HTTP: the second prompt (the first step's long output) is over the server's
    window; its 400 ends the rollout, and the container that holds the answer scores 1.0."""
    from llenvs_async.backends.openai import OpenAIBackend
    from llenvs_async.testing.openai_server import serve_openai_compatible

    def policy(messages: list[dict[str, Any]]) -> str:
        return "Writing it now.\n```bash\nseq 1 2000 && echo 1 > /tmp/out\n```"

    async with serve_openai_compatible(policy=policy, max_model_len=5000) as server:
        backend = OpenAIBackend(server.base_url, server.model, mode="chat")
        async with backend:
            trajectory = await run_one(make_env, backend)
    assert trajectory.error is None, trajectory.error
    assert trajectory.stop_reason == "context_length" and len(trajectory) == 1
    assert trajectory.total_reward == 1.0
    assert trajectory.transitions[0].info["truncation_reason"] == "context_length"
