"""VLLMBackend against FakeAsyncLLM (the AsyncLLM interface, no GPU or vLLM needed)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

import pytest

from llenvs_async.backends._vllm_compat import sampling_kwargs
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.errors import BackendError, ClosedError
from llenvs_async.testing.fake_vllm import (
    FakeAsyncLLM,
    FakeEngineError,
    FakeTokenizer,
    fake_logprob,
)
from llenvs_async.types import ChatMessage, GenerationRequest, SamplingParams

PARAMS = SamplingParams(max_tokens=32, temperature=0.5, seed=1)
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def request(text: str, *, token_ids: tuple[int, ...] | None = None) -> GenerationRequest:
    return GenerationRequest(
        messages=(ChatMessage(role="user", content=text),), prompt_token_ids=token_ids
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


async def test_engine_error_is_a_backend_error_and_aborts_the_others() -> None:
    n = 4
    engine = FakeAsyncLLM(
        hold_until_in_flight=n, hang=True, fail_when=lambda prompt: "boom" in prompt
    )
    backend = VLLMBackend(engine)
    batch = [request("ok 0"), request("boom"), request("ok 2"), request("ok 3")]
    with pytest.raises(BackendError, match="FakeEngineError: fake engine failure") as info:
        await backend.generate(batch, PARAMS)
    assert isinstance(info.value.__cause__, FakeEngineError)
    others = {rid for rid, prompt, _ in engine.requests if user_text(prompt_text(prompt)) != "boom"}
    assert len(others) == n - 1
    assert others <= set(engine.aborted)
    # The failed request is aborted too (vLLM does it itself; doing it again is harmless).
    assert set(engine.aborted) == {rid for rid, _, _ in engine.requests}
    assert engine.in_flight == set()


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

    backend = VLLMBackend(FakeAsyncLLM(), tokenizer=BrokenTokenizer())
    with pytest.raises(BackendError, match=r"chat templating failed.*no chat template"):
        await backend.generate([request("x")], PARAMS)


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
        "seed": 4,
        "logprobs": 0,
    }
    assert sampling_kwargs(SamplingParams(top_k=0, logprobs=None)).keys() == {
        "n",
        "max_tokens",
        "temperature",
        "top_p",
    }


async def test_without_vllm_the_engine_receives_the_sampling_kwargs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm...` fail
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


async def test_owned_engine_is_shut_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeAsyncLLM()
    seen: dict[str, Any] = {}

    def fake_build(model: str, kwargs: Mapping[str, Any]) -> FakeAsyncLLM:
        seen.update(model=model, kwargs=dict(kwargs))
        return engine

    monkeypatch.setattr("llenvs_async.backends.vllm.build_engine", fake_build)
    backend = VLLMBackend.from_engine_args(model="tiny", max_model_len=256)
    assert seen == {"model": "tiny", "kwargs": {"max_model_len": 256}}
    await backend.aclose()
    await backend.aclose()
    assert engine.shutdown_calls == 1


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_real_sampling_params_are_built_when_vllm_is_importable() -> None:
    from llenvs_async.backends._vllm_compat import make_sampling_params

    built = make_sampling_params(PARAMS)
    assert (built.max_tokens, built.temperature, built.seed) == (32, 0.5, 1)
