"""Token mode against the real engine: what the engine reports it was sent is what we recorded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import TrajectoryRunner
from llenvs_async.backends.openai import OpenAIBackend
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.envs import ChainEnv
from llenvs_async.runner._rollout import conversation
from llenvs_async.serialization import JsonlWriter, read_trajectories
from llenvs_async.types import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
    Trajectory,
)

from .conftest import Engine, Server

pytestmark = pytest.mark.asyncio(loop_scope="session")

SYSTEM = "Walk to the goal."
TURNS = 5


def params(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=1.0, logprobs=0, seed=seed)


def engine_prompts(traj: Trajectory) -> list[tuple[int, ...]]:
    """The prompt ids the ENGINE reports for each turn (not ours)."""
    out = []
    for t in traj.transitions:
        assert t.completion is not None and t.completion.prompt_token_ids
        out.append(t.completion.prompt_token_ids)
    return out


def check_token_exact(traj: Trajectory) -> None:
    assert traj.error is None, traj.error
    record = traj.token_record()
    assert record is not None
    prompts = engine_prompts(traj)
    sampled = [t.completion.token_ids for t in traj.transitions if t.completion is not None]
    for t in range(len(prompts) - 1):
        # the extension property: turn t+1 starts with turn t's prompt + turn t's sampled ids
        assert prompts[t + 1][: len(prompts[t]) + len(sampled[t])] == prompts[t] + sampled[t]
    for t, prompt in enumerate(prompts):
        assert record.input_ids[: len(prompt)] == prompt  # our record agrees with the engine
        assert record.turns[t] == (len(prompt), len(prompt) + len(sampled[t]))
    masked = [record.input_ids[i] for i, m in enumerate(record.loss_mask) if m]
    assert masked == [i for ids in sampled for i in ids]
    assert record.logprobs is not None and len(record.logprobs) == sum(record.loss_mask)


async def five_turns(backend: Any, n: int, seed: int) -> tuple[TrajectoryRunner, list[Trajectory]]:
    env = ChainEnv(max_steps=TURNS)
    runner = TrajectoryRunner(env, backend, params(seed), system_prompt=SYSTEM, token_mode=True)
    trajs = await runner.run_batch([0] * n)
    return runner, trajs


async def test_five_turn_rollouts_are_token_exact(engine: Engine, hf_tokenizer: Any) -> None:
    _, trajs = await five_turns(VLLMBackend(engine.llm), 8, seed=7)
    for traj in trajs:
        assert len(traj) == TURNS
        check_token_exact(traj)
    # The engine's own first prompt is the tokenizer's rendering of the conversation.
    first = trajs[0].transitions[0].completion
    assert first is not None
    text = hf_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": trajs[0].initial_state.observation.text},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert first.prompt_token_ids == tuple(hf_tokenizer.encode(text, add_special_tokens=False))


async def test_re_templating_would_break_the_extension_property(
    engine: Engine, hf_tokenizer: Any
) -> None:
    """Re-rendering the conversation from completion TEXTS (what the runner did before)
    gives other ids than the engine sampled, for some turn of these rollouts."""
    _, trajs = await five_turns(VLLMBackend(engine.llm), 8, seed=11)
    drifted = merged = 0
    for traj in trajs:
        prompts = engine_prompts(traj)
        for t in range(1, len(prompts)):
            messages = [{"role": "system", "content": SYSTEM}] + [
                {"role": m.role, "content": m.content}
                for m in conversation(traj.transitions[t - 1].next_state)
            ]
            text = hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            retemplated = tuple(hf_tokenizer.encode(text, add_special_tokens=False))
            if retemplated != prompts[t]:
                drifted += 1
            completion = traj.transitions[t - 1].completion
            assert completion is not None
            ids = [i for i in completion.token_ids if i != hf_tokenizer.eos_token_id]
            decoded = hf_tokenizer.decode(ids)
            if tuple(hf_tokenizer.encode(decoded, add_special_tokens=False)) != tuple(ids):
                merged += 1  # the sampled pieces re-tokenize differently (BPE merges)
    assert drifted > 0, "re-templating reproduced every prompt: no drift found to show"
    assert merged > 0


async def test_restored_at_turn_three_sends_the_original_prompt(
    engine: Engine, tmp_path: Path
) -> None:
    runner, [traj] = await five_turns(VLLMBackend(engine.llm), 1, seed=3)
    check_token_exact(traj)
    original = engine_prompts(traj)[3]
    [again] = await runner.run_batch_from_states([traj.states[3]])
    assert engine_prompts(again)[0] == original
    check_token_exact(again)
    path = tmp_path / "runs.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    [back] = read_trajectories(path)
    [from_file] = await runner.run_batch_from_states([back.states[3]])
    assert engine_prompts(from_file)[0] == original


async def test_openai_completions_mode_token_mode(
    engine: Engine, server: Server, tiny_model: Path
) -> None:
    """The HTTP server in completions mode: the same extension property, a restore at turn
    3 sends the original prompt, and a state saved by the in-process run restores too."""
    async with OpenAIBackend(
        server.base_url, server.model, mode="completions", tokenizer=tiny_model
    ) as http:
        runner, trajs = await five_turns(http, 4, seed=5)
        for traj in trajs:
            assert len(traj) == TURNS
            check_token_exact(traj)
        [again] = await runner.run_batch_from_states([trajs[0].states[3]])
        assert engine_prompts(again)[0] == engine_prompts(trajs[0])[3]
        _, [local] = await five_turns(VLLMBackend(engine.llm), 1, seed=9)
        [crossed] = await runner.run_batch_from_states([local.states[3]])
        assert engine_prompts(crossed)[0] == engine_prompts(local)[3]


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


async def test_the_real_server_accepts_our_tool_call_wire_format(
    engine: Engine, server: Server
) -> None:
    """The tiny model cannot call tools, but the server validates the schema: tools, an
    assistant message with tool_calls and a tool reply are accepted as we send them (with
    ``tool_choice: none``, since the server runs without a tool-call parser)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    request = GenerationRequest(
        messages=(
            ChatMessage(role="user", content="add"),
            ChatMessage(role="assistant", content="", tool_calls=(call,)),
            ChatMessage(role="tool", content="5", tool_call_id="call_1"),
        ),
        tools=(ADD_TOOL,),
    )
    sampling = SamplingParams(max_tokens=4, logprobs=0, seed=1)
    async with OpenAIBackend(
        server.base_url, server.model, mode="chat", extra_body={"tool_choice": "none"}
    ) as http:
        [completion] = await http.generate([request], sampling)
    assert isinstance(completion, Completion), completion
    assert completion.token_ids and completion.tool_calls == ()
    # A tool definition without a function name: the server's own schema rejects it (400),
    # as our test server does. (vLLM accepts a tool reply without tool_call_id; OpenAI's
    # schema, which our test server follows, does not.)
    bad = replace(request, tools=({"type": "function", "function": {}},))
    async with OpenAIBackend(
        server.base_url, server.model, mode="chat", extra_body={"tool_choice": "none"}
    ) as http:
        [rejected] = await http.generate([bad], sampling)
    assert isinstance(rejected, GenerationError), rejected
    # In-process: the same messages and tools go through the model's chat template.
    [local] = await VLLMBackend(engine.llm).generate([request], sampling)
    assert isinstance(local, Completion) and local.token_ids


async def test_export_round_trip_of_engine_trajectories(engine: Engine, tmp_path: Path) -> None:
    """Rows read back with ``datasets`` equal the real engine's token records."""
    import datasets

    from llenvs_async.cli import main

    _, trajs = await five_turns(VLLMBackend(engine.llm), 4, seed=21)
    path = tmp_path / "runs.jsonl"
    with JsonlWriter(path) as writer:
        for traj in trajs:
            writer.write_trajectory(traj)
    assert main(["export", str(path), "--format", "parquet", "-o", str(tmp_path / "pq")]) == 0
    rows = datasets.load_dataset("parquet", data_dir=str(tmp_path / "pq"), split="train")
    assert len(rows) == len(trajs)
    for traj, got in zip(trajs, rows, strict=True):
        record = traj.token_record()
        assert record is not None
        assert got["input_ids"] == list(record.input_ids)
        assert got["loss_mask"] == list(record.loss_mask)
        assert got["logprobs"] == pytest.approx(list(record.logprobs or ()))
        assert got["turns"] == [list(span) for span in record.turns]
        assert got["rewards"] == [t.reward for t in traj.transitions]
        assert got["stop_reason"] == traj.stop_reason


# Qwen3's behaviour in a few lines: earlier assistant turns lose their <think> block when
# the conversation is rendered again; the generation prompt may carry an empty one.
QWEN_LIKE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- set content = m.content %}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


async def test_a_template_that_strips_thinking_cannot_drift_in_token_mode(
    hf_tokenizer: Any,
) -> None:
    """With a Qwen3-like template, re-rendering drops earlier <think> blocks (the prompt is
    no longer an extension of what was sampled); token mode keeps the sampled ids."""
    import copy

    from llenvs_async import ScriptedBackend

    tok = copy.deepcopy(hf_tokenizer)
    tok.chat_template = QWEN_LIKE_TEMPLATE
    answer = "<think>\ngo right\n</think>\n\nright"
    sampled = (*tok.encode(answer, add_special_tokens=False), tok.eos_token_id)
    requests: list[GenerationRequest] = []

    def policy(request: GenerationRequest) -> Completion:
        requests.append(request)
        return Completion(text=answer, token_ids=sampled, logprobs=(-1.0,) * len(sampled))

    runner = TrajectoryRunner(
        ChainEnv(max_steps=3),
        ScriptedBackend(policy, tokenizer=tok),
        system_prompt=SYSTEM,
        token_mode=True,
        chat_template_kwargs={"enable_thinking": True},
    )
    [traj] = await runner.run_batch([2])
    assert traj.error is None and len(traj) == 3
    prompts = [r.prompt_token_ids or () for r in requests]
    for t in range(len(prompts) - 1):
        assert prompts[t + 1][: len(prompts[t]) + len(sampled)] == prompts[t] + sampled
    think = tok.encode("go right", add_special_tokens=False)
    assert _count(prompts[2], think) == 2  # both earlier turns keep their thinking
    messages = [{"role": "system", "content": SYSTEM}] + [
        {"role": m.role, "content": m.content} for m in conversation(traj.transitions[1].next_state)
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    retemplated = tuple(tok.encode(text, add_special_tokens=False))
    assert _count(retemplated, think) == 0  # re-rendering stripped them: drift
    assert retemplated != prompts[2]


def _count(ids: tuple[int, ...], piece: list[int]) -> int:
    n = len(piece)
    return sum(1 for i in range(len(ids) - n + 1) if list(ids[i : i + n]) == piece)
