"""OpenAIBackend.update_weights against the real vLLM server (its RL/dev endpoints, dev mode).

The session server is shared: every test here puts the original weights back at the end
(the server then serves exactly what it served before: checked against a first sample).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llenvs_async.backends.openai import OpenAIBackend
from llenvs_async.errors import BackendError
from llenvs_async.types import SamplingParams

from ._requests import chat, completions
from .conftest import Server

pytestmark = pytest.mark.asyncio(loop_scope="session")

VERSIONS = itertools.count(1)
PARAMS = SamplingParams(max_tokens=16, temperature=1.0, logprobs=0)


@pytest.fixture(scope="module")
def original(tiny_model: Path) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def perturbed(model: Any, seed: int) -> Iterator[tuple[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        yield name, p.detach() + torch.randn(p.shape, generator=generator) * 0.05


async def test_update_changes_the_served_model_and_tags_versions(
    server: Server, original: Any
) -> None:
    async with OpenAIBackend(server.base_url, server.model) as llm:
        [before] = completions(await llm.generate([chat("serve", seed=7)], PARAMS))
        assert before.policy_version == 0
        version = next(VERSIONS)
        try:
            await llm.update_weights(perturbed(original, seed=1), version=version, mode="keep")
            assert llm.policy_version == version
            [changed] = completions(await llm.generate([chat("serve", seed=7)], PARAMS))
            assert changed.policy_version == version
            assert (changed.token_ids, changed.logprobs) != (before.token_ids, before.logprobs)
        finally:
            await llm.update_weights(
                original.named_parameters(), version=next(VERSIONS), mode="wait"
            )
        [again] = completions(await llm.generate([chat("serve", seed=7)], PARAMS))
    assert (again.token_ids, again.logprobs) == (before.token_ids, before.logprobs)
    assert again.policy_version == llm.policy_version == version + 1


def added_requests(server: Server, offset: int) -> int:
    """How many requests the server has handed to its engine since byte ``offset`` of its log
    (``--enable-log-requests``: logged once the request is sent to the engine core)."""
    with server.log.open("rb") as log:
        log.seek(offset)
        return log.read().count(b"Added request chatcmpl-")


async def test_abort_mode_over_http_resends_the_aborted_and_loses_nothing(
    server: Server, original: Any
) -> None:
    """The overlap is forced, not hoped for: the test freezes the server's scheduler first
    (``/pause?mode=keep``), sends the batch and waits until the server's log shows every
    request handed to the engine, so all of them are in the engine when the
    ``mode="abort"`` update's own ``/pause`` lands: each must come back resent, once."""
    n, length = 8, 64
    params = SamplingParams(max_tokens=length, temperature=1.0, logprobs=0)
    root = server.base_url.removesuffix("/v1")
    prompts: list[str] = []

    async def count(request: httpx.Request) -> None:
        if request.url.path == "/v1/chat/completions":
            prompts.extend(re.findall(r"abort \d+", request.content.decode()))

    client = httpx.AsyncClient(timeout=120.0, event_hooks={"request": [count]})
    async with (
        client,
        OpenAIBackend(
            server.base_url,
            server.model,
            extra_body={"ignore_eos": True},
            policy_version=None,
            client=client,
        ) as llm,
    ):
        batch = [chat(f"abort {i}", seed=60 + i, index=i) for i in range(n)]
        version = next(VERSIONS)
        offset = server.log.stat().st_size
        frozen = await client.post(f"{root}/pause", params={"mode": "keep"})
        assert frozen.status_code == 200, frozen.text
        try:
            call = asyncio.create_task(llm.generate(batch, params))
            async with asyncio.timeout(60):
                while added_requests(server, offset) < n:
                    assert not call.done(), "the batch finished while the server was frozen"
                    await asyncio.sleep(0.01)
            assert not call.done()
            await llm.update_weights(perturbed(original, seed=2), version=version, mode="abort")
            outs = completions(await call)
        finally:
            await client.post(f"{root}/resume")
            await llm.update_weights(
                original.named_parameters(), version=next(VERSIONS), mode="wait"
            )
    # nothing lost: every request came back whole, generated under the new weights
    assert len(outs) == n
    assert all(c.finish_reason == "length" and len(c.token_ids) == length for c in outs)
    assert all(c.policy_version == version for c in outs)
    # every request was in the engine when the update aborted it, and was sent exactly once more
    assert sorted(prompts) == sorted([f"abort {i}" for i in range(n)] * 2)


async def test_a_server_without_dev_mode_gets_a_clear_error(original: Any) -> None:
    transport = httpx.MockTransport(
        lambda request: httpx.Response(404, json={"detail": "Not Found"})
    )
    async with httpx.AsyncClient(transport=transport) as client:
        llm = OpenAIBackend("http://127.0.0.1:9/v1", "tiny", client=client)
        with pytest.raises(BackendError, match="VLLM_SERVER_DEV_MODE=1"):
            await llm.update_weights(original.named_parameters(), version=1)
        assert llm.policy_version == 0
