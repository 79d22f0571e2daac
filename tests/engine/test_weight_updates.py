"""In-flight weight updates on the real vLLM CPU engine (fp32, tiny model), checked against torch.

The session's fp32 engine (shared with the tier: after this module its original weights and
vLLM's initial ``"default"`` label are put back). Its weights here always mirror ``hf``: a test
perturbs ``hf`` in place and pushes ``hf.named_parameters()``. ``Probe`` wraps the engine to
see a request's tokens as they are produced (cumulative outputs), so an update lands
mid-generation by construction, not by sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.testing.torch_logprobs import completion_logprobs, max_logprob_gap
from llenvs_async.types import Completion, GenerationRequest, SamplingParams

from ._requests import chat, completions
from .conftest import Engine

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Measured on this machine: max |vLLM fp32 - torch fp32| = 2e-6 over these tests' tokens.
TOLERANCE = 1e-4
VERSIONS = itertools.count(1)


class Probe:
    """The engine, but each request streams cumulative outputs (so the test sees progress)
    and ignores EOS (so its length is ``max_tokens``). ``reached(n)`` fires when a
    request has produced ``n`` tokens; ``submitted`` counts attempts per prompt."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.submitted: dict[tuple[int, ...], int] = {}
        self._watch: tuple[int, asyncio.Event] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    def reached(self, tokens: int) -> asyncio.Event:
        event = asyncio.Event()
        self._watch = (tokens, event)
        return event

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        key = tuple(prompt["prompt_token_ids"])
        self.submitted[key] = self.submitted.get(key, 0) + 1
        params = params.clone()
        params.output_kind = RequestOutputKind.CUMULATIVE
        params.ignore_eos = True
        async for output in self.llm.generate(prompt, params, request_id):
            if self._watch and len(output.outputs[0].token_ids) >= self._watch[0]:
                self._watch[1].set()
            yield output


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fp32(engine: Engine) -> AsyncIterator[Any]:
    """The session engine; the original weights are loaded back after the module."""
    import torch
    from transformers import LlamaForCausalLM

    try:
        yield engine.llm
    finally:
        original = LlamaForCausalLM.from_pretrained(engine.model, dtype=torch.float32)
        await VLLMBackend(engine.llm).update_weights(original.named_parameters(), version=0)
        await engine.llm.update_weight_version("default")


@pytest.fixture(scope="module")
def hf(tiny_model: Path) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def perturb(model: Any, seed: int, scale: float = 0.05) -> dict[str, Any]:
    """Add seeded noise to every weight in place; returns the weights from before."""
    import torch

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return before


def torch_logprobs(model: Any, prompt: tuple[int, ...], ids: tuple[int, ...]) -> list[float]:
    import torch

    with torch.no_grad():
        [lp] = completion_logprobs(model, [(prompt, ids)])
    return [float(x) for x in lp]


async def engine_scores(llm: Any, prompt: tuple[int, ...], ids: tuple[int, ...]) -> list[float]:
    """The engine's logprobs of a FIXED continuation: prompt logprobs of prompt + ids."""
    from vllm import SamplingParams as VllmParams
    from vllm.sampling_params import RequestOutputKind

    params = VllmParams(max_tokens=1, prompt_logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
    final = None
    async for out in llm.generate(
        {"prompt_token_ids": [*prompt, *ids]}, params, f"score-{id(ids)}"
    ):
        final = out
    assert final is not None
    return [final.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(ids)]


def gap(a: list[float], b: list[float] | tuple[float, ...]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def with_state(model: Any, state: dict[str, Any]) -> Any:
    import copy

    other = copy.deepcopy(model)
    other.load_state_dict(state, strict=False)
    return other


async def test_update_weights_matches_torch_and_changes_the_logprobs(fp32: Any, hf: Any) -> None:
    backend = VLLMBackend(fp32)
    params = SamplingParams(max_tokens=16, temperature=1.0, logprobs=0)
    [c] = completions(await backend.generate([chat("weights", seed=3)], params))
    prompt, ids = c.prompt_token_ids, c.token_ids
    before = await engine_scores(fp32, prompt, ids)
    assert gap(before, torch_logprobs(hf, prompt, ids)) <= TOLERANCE
    assert gap(before, c.logprobs or ()) <= TOLERANCE

    perturb(hf, seed=1)
    version = next(VERSIONS)
    await backend.update_weights(hf.named_parameters(), version=version)
    assert backend.policy_version == version
    after = await engine_scores(fp32, prompt, ids)
    assert gap(after, torch_logprobs(hf, prompt, ids)) <= TOLERANCE
    assert gap(after, before) > 100 * TOLERANCE  # the update really changed the model
    [new] = completions(await backend.generate([chat("weights", seed=3)], params))
    assert new.policy_version == version
    assert new.version_spans == ((version, 0, len(new.token_ids)),)
    assert gap(torch_logprobs(hf, new.prompt_token_ids, new.token_ids), new.logprobs or ()) <= (
        TOLERANCE
    )


async def test_keep_continues_a_request_across_the_update_and_records_both_versions(
    fp32: Any, hf: Any
) -> None:
    probe = Probe(fp32)
    backend = VLLMBackend(probe, policy_version=None)
    old_version = next(VERSIONS)
    await backend.update_weights(hf.named_parameters(), version=old_version)
    params = SamplingParams(max_tokens=700, temperature=1.0, logprobs=0)
    started = probe.reached(8)
    call = asyncio.create_task(backend.generate([chat("keep", seed=5)], params))
    await started.wait()
    old = perturb(hf, seed=2)
    version = next(VERSIONS)
    await backend.update_weights(hf.named_parameters(), version=version, mode="keep")
    [c] = completions(await call)

    assert c.finish_reason == "length" and len(c.token_ids) == 700
    [(v0, s0, split), (v1, s1, end)] = c.version_spans
    assert (v0, s0, v1, s1, end) == (old_version, 0, version, split, 700)
    assert 8 <= split < 700 and c.policy_version == version
    assert c.policy_versions == (old_version, version)
    assert probe.submitted == {c.prompt_token_ids: 1}  # continued, not restarted
    # old tokens are the old weights' samples; new ones the new weights' given the same prefix
    # (the kept request's KV was recomputed under the new weights)
    logprobs = c.logprobs or ()
    head, tail = c.token_ids[:split], c.token_ids[split:]
    assert gap(torch_logprobs(with_state(hf, old), c.prompt_token_ids, head), logprobs[:split]) <= (
        TOLERANCE
    )
    assert gap(torch_logprobs(hf, c.prompt_token_ids + head, tail), logprobs[split:]) <= TOLERANCE


@pytest.mark.parametrize("mode", ["keep", "wait", "abort"])
async def test_no_request_is_lost_or_duplicated(fp32: Any, hf: Any, mode: str) -> None:
    probe = Probe(fp32)
    backend = VLLMBackend(probe, policy_version=None)
    old_version = next(VERSIONS)
    await backend.update_weights(hf.named_parameters(), version=old_version)
    n, length = 6, 320
    batch = [chat(f"batch {i}", seed=20 + i, index=i) for i in range(n)]
    params = SamplingParams(max_tokens=length, temperature=1.0, logprobs=0)
    started = probe.reached(4)
    call = asyncio.create_task(backend.generate(batch, params))
    await started.wait()
    perturb(hf, seed=3)
    version = next(VERSIONS)
    await backend.update_weights(hf.named_parameters(), version=version, mode=mode)  # type: ignore[arg-type]
    outs = completions(await call)

    assert len(outs) == n and len({c.prompt_token_ids for c in outs}) == n
    assert all(c.finish_reason == "length" and len(c.token_ids) == length for c in outs)
    attempts = [probe.submitted[c.prompt_token_ids] for c in outs]
    versions = [c.policy_versions for c in outs]
    if mode == "wait":  # drained under the old weights, then updated
        assert attempts == [1] * n and versions == [(old_version,)] * n
    elif mode == "keep":  # continued: at least the request we saw started spans both
        assert attempts == [1] * n and (old_version, version) in versions
    else:  # aborted ones were regenerated from scratch, entirely under the new weights
        assert any(a == 2 for a in attempts) and set(attempts) <= {1, 2}
        for a, c in zip(attempts, outs, strict=True):
            assert a == 1 or c.policy_versions == (version,)
    assert backend.policy_version == version


async def test_engine_and_torch_logprobs_agree_on_a_sampled_batch(fp32: Any, hf: Any) -> None:
    """The trainer/engine consistency check: torch recomputes what the engine sampled."""
    backend = VLLMBackend(fp32)
    await backend.update_weights(hf.named_parameters(), version=next(VERSIONS))
    params = SamplingParams(max_tokens=32, temperature=1.0, logprobs=0)
    batch: list[GenerationRequest] = [chat(f"consistency {i}", seed=i, index=i) for i in range(16)]
    outs: list[Completion] = completions(await backend.generate(batch, params))
    pairs = [(c.prompt_token_ids, c.token_ids) for c in outs]
    worst = max_logprob_gap(hf, pairs, [c.logprobs or () for c in outs])
    tokens = sum(len(c.token_ids) for c in outs)
    print(f"max |engine - torch| logprob over {tokens} sampled tokens: {worst:.2e}")
    assert worst <= TOLERANCE
