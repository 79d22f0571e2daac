"""VLLMBackend against FakeAsyncLLM (the AsyncLLM interface, no GPU or vLLM needed)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import weakref
from collections.abc import Mapping
from typing import Any

import pytest

from llenvs_async.backends._vllm_compat import sampling_kwargs
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.errors import BackendError, ClosedError, ContextLengthError
from llenvs_async.testing.fake_vllm import (
    EngineDeadError,
    FakeAsyncLLM,
    FakeEngineError,
    FakeTokenizer,
    fake_logprob,
)
from llenvs_async.types import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)

PARAMS = SamplingParams(max_tokens=32, temperature=0.5, seed=1)
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def request(
    text: str,
    *,
    token_ids: tuple[int, ...] | None = None,
    seed: int | None = None,
    rollout_index: int = 0,
) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage(role="user", content=text),),
        prompt_token_ids=token_ids,
        seed=seed,
        rollout_index=rollout_index,
    )


def sent_token_ids(prompt: Any) -> list[int]:
    assert isinstance(prompt, Mapping)
    return list(prompt["prompt_token_ids"])


async def test_all_requests_of_a_round_are_in_flight_together() -> None:
    n = 16
    engine = FakeAsyncLLM(hold_until_in_flight=n, hold_timeout=1.0, policy=user_text)
    backend = VLLMBackend(engine)
    completions = await backend.generate([request(f"task {i}") for i in range(n)], PARAMS)
    assert engine.max_in_flight == n
    assert len({request_id for request_id, _, _ in engine.requests}) == n
    assert [c.text for c in completions] == [f"task {i}" for i in range(n)]


def user_text(prompt: str) -> str:
    """A policy answering with the user message of a one-message templated chat."""
    return prompt.removeprefix("<|user|>").removesuffix("<|assistant|>")


async def test_token_ids_and_sampled_logprobs_are_mapped_from_the_final_output() -> None:
    engine = FakeAsyncLLM(policy=lambda prompt: "x" * 50, chunks=4)
    backend = VLLMBackend(engine)
    [long, short] = await backend.generate(
        [request("a"), request("b")], SamplingParams(max_tokens=20, logprobs=1)
    )
    ids = tuple(engine.tokenizer.encode("x" * 20, add_special_tokens=False))
    assert long.text == "x" * 20
    assert long.token_ids == ids
    assert long.logprobs == tuple(
        fake_logprob(t) for t in ids
    )  # the sampled token, not the top one
    assert long.finish_reason == "length"
    assert long.prompt_token_ids == tuple(sent_token_ids(engine.requests[0][1]))
    assert short.token_ids == ids


async def test_logprobs_none_gives_no_logprobs() -> None:
    backend = VLLMBackend(FakeAsyncLLM())
    [completion] = await backend.generate([request("a")], SamplingParams(logprobs=None))
    assert completion.logprobs is None
    assert completion.finish_reason == "stop"


async def test_cancelling_generate_aborts_every_in_flight_request() -> None:
    n = 5
    engine = FakeAsyncLLM(hang=True)
    backend = VLLMBackend(engine)
    task = asyncio.create_task(backend.generate([request(f"t{i}") for i in range(n)], PARAMS))
    async with asyncio.timeout(10):
        await engine.wait_in_flight(n)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    submitted = {request_id for request_id, _, _ in engine.requests}
    assert len(submitted) == n
    assert set(engine.aborted) == submitted
    assert engine.in_flight == set()


async def test_an_engine_error_for_one_request_is_its_own_generation_error() -> None:
    n = 4
    engine = FakeAsyncLLM(
        hold_until_in_flight=n, policy=user_text, fail_when=lambda prompt: "boom" in prompt
    )
    backend = VLLMBackend(engine)
    batch = [request("ok 0"), request("boom", rollout_index=9), request("ok 2"), request("ok 3")]
    outcomes = await backend.generate(batch, PARAMS)
    assert engine.max_in_flight == n
    failed = outcomes[1]
    assert isinstance(failed, GenerationError) and failed.request_index == 1
    assert type(failed.error) is BackendError
    assert isinstance(failed.error.__cause__, FakeEngineError)
    message = str(failed.error)
    assert "request 1 of the round, rollout 9, step 0" in message
    assert "FakeEngineError: fake engine failure" in message
    assert [o.text for i, o in enumerate(outcomes) if i != 1] == ["ok 0", "ok 2", "ok 3"]
    # The failed request is aborted (vLLM does it itself; doing it again is harmless).
    [failed_id] = [rid for rid, p, _ in engine.requests if user_text(prompt_text(p)) == "boom"]
    assert engine.aborted == [failed_id]
    assert engine.in_flight == set()


async def test_a_context_length_message_becomes_a_context_length_error() -> None:
    class TooLong(FakeAsyncLLM):
        async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kw: Any):  # type: ignore[no-untyped-def]
            raise ValueError(
                "The decoder prompt (length 1100) is longer than the maximum model length of 1024."
            )
            yield  # an async generator, like AsyncLLM.generate

    [outcome] = await VLLMBackend(TooLong()).generate([request("x")], PARAMS)
    assert isinstance(outcome, GenerationError)
    assert isinstance(outcome.error, ContextLengthError)


async def test_a_dead_engine_fails_the_round_and_aborts_the_others() -> None:
    n = 4
    engine = FakeAsyncLLM(hold_until_in_flight=n, hang=True, die_when=lambda p: "boom" in p)
    backend = VLLMBackend(engine)
    batch = [request("ok 0"), request("boom"), request("ok 2"), request("ok 3")]
    with pytest.raises(BackendError, match="EngineDeadError") as info:
        await backend.generate(batch, PARAMS)
    assert isinstance(info.value.__cause__, EngineDeadError)
    assert set(engine.aborted) == {rid for rid, _, _ in engine.requests}
    assert len(engine.aborted) == n
    assert engine.in_flight == set()


async def test_every_request_is_sent_with_its_own_seed() -> None:
    engine = FakeAsyncLLM()
    seeds = [7, 8, None]
    batch = [request(f"t{i}", seed=s) for i, s in enumerate(seeds)]
    await VLLMBackend(engine).generate(batch, PARAMS)
    sent = {user_text(prompt_text(p)): _seed_of(sp) for _, p, sp in engine.requests}
    # PARAMS.seed (the run's base seed) is never sent: the runner derived the request seeds.
    assert sent == {"t0": 7, "t1": 8, "t2": None}


def _seed_of(sampling_params: Any) -> Any:
    if isinstance(sampling_params, Mapping):
        return sampling_params.get("seed")
    return sampling_params.seed


def prompt_text(prompt: Any) -> str:
    return FakeTokenizer().decode(sent_token_ids(prompt))


async def test_prompt_token_ids_are_passed_through_without_templating() -> None:
    engine = FakeAsyncLLM()
    backend = VLLMBackend(engine)
    ids = (1, 1104, 1105)
    [completion] = await backend.generate([request("ignored", token_ids=ids)], PARAMS)
    assert sent_token_ids(engine.requests[0][1]) == list(ids)
    assert completion.prompt_token_ids == ids
    assert engine.tokenizer.template_calls == []


@pytest.mark.parametrize("async_tokenizer", [False, True])
async def test_messages_are_chat_templated_with_the_engine_tokenizer(async_tokenizer: bool) -> None:
    engine = FakeAsyncLLM(async_tokenizer=async_tokenizer)
    backend = VLLMBackend(engine)
    messages = (ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="hi"))
    await backend.generate([GenerationRequest(messages=messages)], PARAMS)
    assert engine.tokenizer.template_calls == [
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    ]
    expected = engine.tokenizer.encode(
        "<|system|>sys<|user|>hi<|assistant|>", add_special_tokens=False
    )
    assert sent_token_ids(engine.requests[0][1]) == expected


async def test_an_explicit_tokenizer_is_used_and_template_errors_are_backend_errors() -> None:
    class BrokenTokenizer:
        def apply_chat_template(self, *args: Any, **kwargs: Any) -> str:
            raise ValueError("no chat template")

    engine = FakeAsyncLLM()
    backend = VLLMBackend(engine, tokenizer=BrokenTokenizer())
    [outcome] = await backend.generate([request("x")], PARAMS)
    assert isinstance(outcome, GenerationError) and isinstance(outcome.error, BackendError)
    assert re.search(r"chat templating failed for request 0 .*no chat template", str(outcome.error))
    assert engine.requests == []


async def test_request_ids_are_unique_across_calls() -> None:
    engine = FakeAsyncLLM()
    backend = VLLMBackend(engine)
    for _ in range(3):
        await backend.generate([request("a"), request("b")], PARAMS)
    ids = [request_id for request_id, _, _ in engine.requests]
    assert len(ids) == len(set(ids)) == 6


def test_sampling_kwargs_map_every_field() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.3, top_p=0.8, top_k=5, stop=("x",), seed=4)
    assert sampling_kwargs(params) == {
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 5,
        "stop": ["x"],
        "include_stop_str_in_output": True,  # the text keeps what the ids keep
        "logprobs": 0,
    }
    assert sampling_kwargs(params, seed=12)["seed"] == 12
    assert sampling_kwargs(SamplingParams(top_k=0, logprobs=None)).keys() == {
        "n",
        "max_tokens",
        "temperature",
        "top_p",
    }


async def test_without_vllm_the_engine_receives_the_sampling_kwargs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Makes `import vllm...` fail, also for submodules an earlier test already imported.
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "vllm", None)
    engine = FakeAsyncLLM()
    await VLLMBackend(engine).generate([request("a")], PARAMS)
    _, prompt, sampling_params = engine.requests[0]
    assert sampling_params == sampling_kwargs(PARAMS)
    assert set(prompt) == {"prompt_token_ids"}


def test_building_from_model_args_without_vllm_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(BackendError, match=r"pip install 'llenvs-async\[vllm\]'"):
        VLLMBackend.from_engine_args(model="some/model", max_model_len=512)
    with pytest.raises(BackendError, match="pip install"):
        VLLMBackend(model="some/model")


def test_constructor_needs_exactly_one_of_engine_or_model() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        VLLMBackend()
    with pytest.raises(ValueError, match="exactly one"):
        VLLMBackend(FakeAsyncLLM(), model="m")
    with pytest.raises(ValueError, match="need model="):
        VLLMBackend(FakeAsyncLLM(), gpu_memory_utilization=0.5)


async def test_user_engine_is_not_shut_down_and_closed_backend_refuses_work() -> None:
    engine = FakeAsyncLLM()
    async with VLLMBackend(engine) as backend:
        assert await backend.generate([], PARAMS) == []
    await backend.aclose()
    assert engine.shutdown_calls == 0
    with pytest.raises(ClosedError):
        await backend.generate([request("a")], PARAMS)
    assert engine.requests == []


async def test_owned_engine_is_shut_down_once_and_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Released, not only shut down: a backend that lives on to interpreter exit would keep
    the engine to then, and vLLM's ``AsyncLLM.__del__`` shuts it down again and fails
    (``shutdown_prometheus`` is None by then)."""
    seen: dict[str, Any] = {}
    built: list[FakeAsyncLLM] = []

    def fake_build(model: str, kwargs: Mapping[str, Any]) -> FakeAsyncLLM:
        seen.update(model=model, kwargs=dict(kwargs))
        built.append(FakeAsyncLLM())
        return built[-1]

    monkeypatch.setattr("llenvs_async.backends.vllm.build_engine", fake_build)
    backend = VLLMBackend.from_engine_args(model="tiny", max_model_len=256)
    assert seen == {"model": "tiny", "kwargs": {"max_model_len": 256}}
    assert backend.engine is built[0]
    await backend.aclose()
    await backend.aclose()
    assert built[0].shutdown_calls == 1
    with pytest.raises(ClosedError):
        backend.engine  # noqa: B018
    released = weakref.ref(built.pop())
    assert released() is None  # the backend, still alive, holds no reference to it


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_real_sampling_params_are_built_when_vllm_is_importable() -> None:
    from llenvs_async.backends._vllm_compat import make_sampling_params

    built = make_sampling_params(PARAMS)
    assert (built.max_tokens, built.temperature, built.seed) == (32, 0.5, None)
    assert make_sampling_params(PARAMS, seed=5).seed == 5


def _max_tokens_of(sampling_params: Any) -> int:
    if isinstance(sampling_params, Mapping):
        return int(sampling_params["max_tokens"])
    return int(sampling_params.max_tokens)


async def test_max_tokens_is_clamped_to_what_the_prompt_leaves_of_the_window() -> None:
    engine = FakeAsyncLLM(policy=lambda prompt: "y" * 100)
    backend = VLLMBackend(engine, context_length=50)
    assert backend.context_length == 50 and await backend.get_context_length() == 50
    ids = tuple(engine.tokenizer.encode("p" * 40, add_special_tokens=False))
    short = tuple(engine.tokenizer.encode("p" * 5, add_special_tokens=False))
    near, far = await backend.generate(
        [request("x", token_ids=ids), request("x", token_ids=short)], PARAMS
    )
    sent = {len(sent_token_ids(p)): _max_tokens_of(sp) for _, p, sp in engine.requests}
    assert sent == {len(ids): 50 - len(ids), len(short): PARAMS.max_tokens}
    assert isinstance(near, Completion) and len(near.token_ids) == 50 - len(ids)
    assert near.finish_reason == "length"
    assert isinstance(far, Completion) and len(far.token_ids) == PARAMS.max_tokens


async def test_a_prompt_that_fills_the_window_fails_alone_without_the_engine() -> None:
    engine = FakeAsyncLLM(policy=user_text)
    backend = VLLMBackend(engine, context_length=30)
    full = tuple(engine.tokenizer.encode("p" * 30, add_special_tokens=False))
    ok, over = await backend.generate(
        [request("fine"), request("x", token_ids=full, rollout_index=3)], PARAMS
    )
    assert isinstance(ok, Completion) and ok.text == "fine"
    assert isinstance(over, GenerationError) and over.request_index == 1
    assert isinstance(over.error, ContextLengthError)
    message = str(over.error)
    assert "rollout 3" in message and "30 tokens" in message and "no room" in message
    assert len(engine.requests) == 1  # the full prompt never reached the engine


async def test_without_a_known_window_nothing_is_clamped() -> None:
    engine = FakeAsyncLLM(policy=lambda prompt: "y" * 100)
    backend = VLLMBackend(engine)
    assert backend.context_length is None
    [completion] = await backend.generate([request("x")], PARAMS)
    assert isinstance(completion, Completion)
    assert _max_tokens_of(engine.requests[0][2]) == PARAMS.max_tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
async def test_a_forced_tool_choice_without_a_tool_parser_is_that_requests_error(
    choice: Any,
) -> None:
    engine = FakeAsyncLLM(policy=user_text)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    forced = GenerationRequest(
        messages=(ChatMessage(role="user", content="x"),), tools=(tool,), tool_choice=choice
    )
    free = GenerationRequest(
        messages=(ChatMessage(role="user", content="free"),), tools=(tool,), tool_choice="auto"
    )
    outcome, ok = await VLLMBackend(engine).generate([forced, free], PARAMS)
    assert isinstance(outcome, GenerationError) and outcome.request_index == 0
    assert "needs VLLMBackend(tool_call_parser=...)" in str(outcome.error)
    assert isinstance(ok, Completion)
    assert len(engine.requests) == 1


async def test_chat_template_kwargs_and_tools_reach_the_template() -> None:
    seen: list[dict[str, Any]] = []

    class Recording:
        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
            seen.append(kwargs)
            return "<|user|>x<|assistant|>"

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return FakeTokenizer().encode(text, add_special_tokens=add_special_tokens)

    tool = {"type": "function", "function": {"name": "f"}}
    backend = VLLMBackend(
        FakeAsyncLLM(), tokenizer=Recording(), chat_template_kwargs={"enable_thinking": False}
    )
    await backend.generate(
        [GenerationRequest(messages=(ChatMessage(role="user", content="x"),), tools=(tool,))],
        PARAMS,
    )
    assert seen == [
        {
            "tokenize": False,
            "add_generation_prompt": True,
            "enable_thinking": False,
            "tools": [tool],
        }
    ]


def test_bad_window_and_strict_level_arguments_are_refused() -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="context_length"):
            VLLMBackend(FakeAsyncLLM(), context_length=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_strict_level must be one of auto, function"):
        VLLMBackend(FakeAsyncLLM(), tool_strict_level="strict")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_an_unknown_parser_name_is_a_value_error_listing_vllms_names() -> None:
    with pytest.raises(ValueError, match=r"tool_call_parser='hermes3' .*\bhermes\b.*\bmistral\b"):
        VLLMBackend(FakeAsyncLLM(), tool_call_parser="hermes3")
    with pytest.raises(ValueError, match=r"reasoning_parser='qwen' .*\bdeepseek_r1\b.*\bqwen3\b"):
        VLLMBackend(FakeAsyncLLM(), reasoning_parser="qwen")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
async def test_an_engine_built_here_gets_the_reasoning_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake_build(model: str, kwargs: Mapping[str, Any]) -> FakeAsyncLLM:
        seen.update(kwargs)
        return FakeAsyncLLM()

    monkeypatch.setattr("llenvs_async.backends.vllm.build_engine", fake_build)
    backend = VLLMBackend.from_engine_args(
        model="tiny", reasoning_parser="qwen3", tool_call_parser="hermes", max_model_len=64
    )
    assert seen == {"reasoning_parser": "qwen3", "max_model_len": 64}
    await backend.aclose()
