"""Opt-in (``pytest -m gpu``): VLLMBackend on a real AsyncLLM with a tiny model.

Needs vLLM and a CUDA GPU; skipped otherwise. The model (``LLENVS_GPU_MODEL``, a hub
name or a local path; default ``Qwen/Qwen2.5-0.5B-Instruct``) must have a chat template
and is loaded offline (``HF_HUB_OFFLINE=1``: a hub name must already be in the local cache;
no test downloads), with vLLM's usage reporting off.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS"):
    os.environ.setdefault(_name, "1")  # before vLLM is imported: nothing leaves the machine

from llenvs_async.backends.vllm import VLLMBackend  # noqa: E402
from llenvs_async.types import ChatMessage, GenerationRequest, SamplingParams  # noqa: E402

MODEL = os.environ.get("LLENVS_GPU_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")


def _cuda_with_vllm() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    torch = importlib.import_module("torch")  # untyped here: keep mypy independent of torch
    return bool(torch.cuda.is_available())


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _cuda_with_vllm(), reason="needs vLLM and a CUDA GPU"),
]


async def test_real_engine_generates_a_batch_with_token_ids_and_logprobs() -> None:
    backend = VLLMBackend.from_engine_args(
        model=MODEL, max_model_len=1024, gpu_memory_utilization=0.3, enforce_eager=True, seed=0
    )
    async with backend:
        requests = [
            GenerationRequest(
                messages=(ChatMessage(role="user", content=f"Count from 1 to {i + 3}."),)
            )
            for i in range(8)
        ]
        params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=0)
        completions = await backend.generate(requests, params)
        assert len(completions) == 8
        for completion in completions:
            assert completion.text.strip()
            assert 0 < len(completion.token_ids) <= 24
            assert completion.logprobs is not None
            assert len(completion.logprobs) == len(completion.token_ids)
            assert all(lp <= 0.0 for lp in completion.logprobs)
            assert completion.prompt_token_ids
            assert completion.finish_reason in ("stop", "length")
        # Prompts differ, so their templated token ids differ too.
        assert len({c.prompt_token_ids for c in completions}) == 8

        first = completions[0]
        [again] = await backend.generate(
            [GenerationRequest(messages=(), prompt_token_ids=first.prompt_token_ids)], params
        )
        assert again.prompt_token_ids == first.prompt_token_ids
        assert again.token_ids
