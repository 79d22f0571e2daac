"""Tool calls pass through: tools on the request, the model's calls on the action, tool replies
in the next conversation, in OpenAI's chat wire format (checked by our test server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    Action,
    ChatMessage,
    Completion,
    GenerationRequest,
    Observation,
    OpenAIBackend,
    SamplingParams,
    ScriptedBackend,
    State,
    StepResult,
    TrajectoryRunner,
)
from llenvs_async.backends._openai_wire import chat_payload, parse_chat_response
from llenvs_async.env import BaseEnvironment, new_episode_id
from llenvs_async.serialization import JsonlWriter, read_trajectories
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer
from llenvs_async.testing.openai_server import serve_openai_compatible
from llenvs_async.types import ToolReply

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class AddEnv(BaseEnvironment):
    """Step 1: the agent calls ``add``; the tool's result is the observation (a tool reply).
    Step 2: the agent answers with the sum in text (reward 1.0 when right)."""

    pure_step = True

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        return State(observation=Observation(text="What is 2 + 3?"), episode_id=new_episode_id())

    async def _step(self, state: State, action: Action) -> StepResult:
        if state.step == 0:
            [call] = action.tool_calls
            args = json.loads(call["function"]["arguments"])
            reply = ToolReply(tool_call_id=call["id"], content=str(args["a"] + args["b"]))
            observation = Observation(text=reply.content, tool_replies=(reply,))
            return StepResult.of(state.advance(action, observation))
        done = state.advance(action, Observation(text="ok"), terminated=True)
        return StepResult.of(done, 1.0 if action.text.strip() == "5" else 0.0)


def agent(messages: list[dict[str, Any]]) -> Any:
    if messages[-1]["role"] == "tool":
        return messages[-1]["content"]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
    }
    return {"content": "", "tool_calls": [call]}


async def test_tool_calls_round_trip_through_the_chat_wire(tmp_path: Path) -> None:
    async with serve_openai_compatible(policy=agent) as server:
        backend = OpenAIBackend(server.base_url, server.model, mode="chat")
        async with backend, AddEnv(max_steps=4) as env:
            runner = TrajectoryRunner(env, backend, SamplingParams(), tools=[ADD_TOOL])
            [traj] = await runner.run_batch([None])
        bodies = [r.json for r in server.requests if r.path.endswith("/chat/completions")]
    assert traj.error is None, traj.error
    assert traj.total_reward == 1.0 and len(traj) == 2
    first = traj.transitions[0]
    assert first.action.tool_calls == first.completion.tool_calls  # type: ignore[union-attr]
    assert first.completion is not None and first.completion.finish_reason == "tool_calls"
    assert all(body["tools"] == [ADD_TOOL] for body in bodies)
    second = bodies[1]["messages"]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == "call_1"
    assert second[-1] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    path = tmp_path / "runs.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    [back] = read_trajectories(path)
    assert back == traj
    assert back.transitions[0].completion == first.completion


async def test_the_test_server_rejects_a_tool_reply_without_its_call_id() -> None:
    bad = GenerationRequest(
        messages=(
            ChatMessage(role="user", content="hi"),
            ChatMessage(role="tool", content="5"),
        )
    )
    async with (
        serve_openai_compatible() as server,
        OpenAIBackend(server.base_url, server.model, mode="chat") as backend,
    ):
        [outcome] = await backend.generate([bad], SamplingParams())
    assert not hasattr(outcome, "text")
    assert "tool_call_id" in str(outcome.error)  # type: ignore[union-attr]


def test_chat_payload_carries_tools_and_tool_messages() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    request = GenerationRequest(
        messages=(
            ChatMessage(role="user", content="q"),
            ChatMessage(role="assistant", content="", tool_calls=(call,)),
            ChatMessage(role="tool", content="5", tool_call_id="c"),
        ),
        tools=(ADD_TOOL,),
    )
    payload = chat_payload("m", request, SamplingParams(), vllm_extras=False, extra_body={})
    assert payload["tools"] == [ADD_TOOL]
    assert payload["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert payload["messages"][2] == {"role": "tool", "content": "5", "tool_call_id": "c"}
    assert "tools" not in chat_payload(
        "m", GenerationRequest(messages=()), SamplingParams(), vllm_extras=False, extra_body={}
    )


def test_parse_rejects_malformed_tool_calls() -> None:
    from llenvs_async.backends._openai_wire import MalformedResponse

    def reply(calls: Any) -> dict[str, Any]:
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}

    good = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert parse_chat_response(reply([good])).tool_calls == (good,)
    with pytest.raises(MalformedResponse, match="tool_calls"):
        parse_chat_response(reply({"not": "a list"}))
    with pytest.raises(MalformedResponse, match=r"tool_calls\[0\]"):
        parse_chat_response(reply([{"id": "c"}]))


def test_runner_rejects_bad_tool_definitions() -> None:
    from llenvs_async import ScriptedBackend
    from llenvs_async.envs import ChainEnv

    with pytest.raises(ValueError, match=r"tools\[0\]"):
        TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: "x"), tools=[{"name": "add"}])
    with pytest.raises(TypeError, match="sequence of tool definitions"):
        TrajectoryRunner(ChainEnv(), ScriptedBackend(lambda r: "x"), tools=ADD_TOOL)  # type: ignore[arg-type]


class ShownAsCall(BaseEnvironment):
    """What a ``tools`` shell task does with a command written by hand: the state keeps the
    action, the observation says how it is shown (a tool call) and answers that call."""

    pure_step = True

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        return State(observation=Observation(text="list it"), episode_id=new_episode_id())

    async def _step(self, state: State, action: Action) -> StepResult:
        call = {
            "id": f"call_{state.step + 1}_0",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": action.text})},
        }
        reply = ToolReply(tool_call_id=call["id"], content=f"ran {action.text}")
        data = {"shown_action": {"content": "", "tool_calls": [call]}}
        if state.step == 0:
            ran = Observation(text="ran", data=data, tool_replies=(reply,))
            return StepResult.of(state.advance(action, ran))
        return StepResult.of(state.advance(action, Observation(text="ok"), terminated=True), 1.0)


async def test_a_forced_command_is_sent_and_tokenized_as_the_tool_call_shown() -> None:
    tok = ChatMLTokenizer()
    seen: list[GenerationRequest] = []

    def policy(request: GenerationRequest) -> Completion:
        seen.append(request)
        ids = (*tok.char_ids("done"), IM_END)
        return Completion(
            text="done",
            token_ids=ids,
            finish_reason="stop",
            prompt_token_ids=request.prompt_token_ids or (),
        )

    env = ShownAsCall()
    start = await env.reset()
    for token_mode in (False, True):
        backend = ScriptedBackend(policy, tokenizer=tok if token_mode else None)
        runner = TrajectoryRunner(env, backend, token_mode=token_mode)
        [traj] = await runner.run_batch_from_state_actions([start], [Action(text="ls")])
        assert traj.error is None and traj.total_reward == 1.0
        assert traj.transitions[0].action == Action(text="ls")  # kept as taken
        if not token_mode:
            assistant, reply = seen[-1].messages[-2:]
            assert assistant.role == "assistant" and assistant.tool_calls[0]["id"] == "call_1_0"
            assert (reply.role, reply.tool_call_id, reply.content) == ("tool", "call_1_0", "ran ls")
            continue
        step = traj.transitions[0].tokens
        assert step is not None and not step.sampled
        call = '{"name": "bash", "arguments": {"command": "ls"}}'
        assert tok.decode(step.action_ids) == f"\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
        assert tok.decode(step.observation_ids).startswith("<|im_start|>tool\nran ls<|im_end|>")
