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


async def metric(server: Server, client: httpx.AsyncClient, name: str, labels: str = "") -> float:
    """One sample of the server's Prometheus ``/metrics`` (summed over matching label sets)."""
    text = (await client.get(f"{server.base_url.removesuffix('/v1')}/metrics")).text
    found = re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.MULTILINE)
    values = [float(v) for label_set, v in found if labels in label_set]
    assert values, f"the server's /metrics has no {name}{{{labels}}}"
    return sum(values)


async def test_abort_mode_over_http_resends_the_aborted_and_loses_nothing(
    server: Server, original: Any
) -> None:
    """The overlap is forced, not hoped for: once the server reports generated tokens, the
    test freezes its scheduler (``/pause?mode=keep``), so the requests that had not
    finished by then (counted on ``/metrics``) are still in the engine when the
    ``mode="abort"`` update's own ``/pause`` lands, and must come back resent."""
    # Long generations (prompt + 900 < MAX_MODEL_LEN), and enough of them that the batch
    # outlasts the metric poll on a quiet machine too (8 finished within one poll once).
    n, length = 32, 900
    params = SamplingParams(max_tokens=length, temperature=1.0, logprobs=0)
    root = server.base_url.removesuffix("/v1")
    posts: list[str] = []

    async def count(request: httpx.Request) -> None:
        posts.append(request.url.path)

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
        finished = "vllm:request_success_total"
        before = await metric(server, client, finished, 'finished_reason="length"')
        tokens = "vllm:generation_tokens_total"
        baseline = await metric(server, client, tokens)
        call = asyncio.create_task(llm.generate(batch, params))
        version = next(VERSIONS)
        try:
            # the server's own count: the batch has started generating (900 tokens to go)
            while await metric(server, client, tokens) <= baseline:
                assert not call.done(), "the batch finished before the server reported a token"
                await asyncio.sleep(0.01)
            frozen = await client.post(f"{root}/pause", params={"mode": "keep"})
            assert frozen.status_code == 200, frozen.text
            done = await metric(server, client, finished, 'finished_reason="length"') - before
            in_engine = n - int(done)
            assert in_engine >= 1, "every request finished before the scheduler was frozen"
            await llm.update_weights(perturbed(original, seed=2), version=version, mode="abort")
            outs = completions(await call)
        finally:
            await client.post(f"{root}/resume")
            await llm.update_weights(
                original.named_parameters(), version=next(VERSIONS), mode="wait"
            )
    # nothing lost: every request came back whole
    assert len(outs) == n
    assert all(c.finish_reason == "length" and len(c.token_ids) == length for c in outs)
    # those still in the engine were aborted and sent once more, under the new version; the
    # ones that had finished were not sent again (no duplicate)
    resent = posts.count("/v1/chat/completions") - n
    assert resent >= 1, posts
    assert resent <= in_engine
    assert sum(c.policy_version == version for c in outs) == resent
    assert all(c.policy_version in (None, version) for c in outs)


async def test_a_server_without_dev_mode_gets_a_clear_error(original: Any) -> None:
    transport = httpx.MockTransport(
        lambda request: httpx.Response(404, json={"detail": "Not Found"})
    )
    async with httpx.AsyncClient(transport=transport) as client:
        llm = OpenAIBackend("http://127.0.0.1:9/v1", "tiny", client=client)
        with pytest.raises(BackendError, match="VLLM_SERVER_DEV_MODE=1"):
            await llm.update_weights(original.named_parameters(), version=1)
        assert llm.policy_version == 0
