"""TRL's ``GRPOTrainer`` trains the real model (SmolLM2-135M-Instruct) on its own rollouts in
containers: our ``rollout_func`` runs the in-process vLLM engine on an easy Harbor task, the
rewards are the task verifier's, and the trainer's weights reach the engine before the second
batch (its completions carry policy version 1). Needs TRL, vLLM (``make real-model``) and
Docker; about two minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import SamplingParams, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter

from ..examples.conftest import load_example
from .conftest import cpu_grpo_config
from .test_trl_harbor import task_containers

pytestmark = [pytest.mark.trainers, pytest.mark.docker, pytest.mark.vllm]


def _brevity(completions: list[Any], **_: Any) -> list[float]:
    """A TRL reward: minus a thousandth of each completion's length in characters."""
    return [-len(str(c)) / 1000 for c in completions]


@pytest.mark.timeout(600)
def test_grpo_trains_the_real_model_on_its_own_container_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_images: None
) -> None:
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("gguf")
    for name in ("TRL_EXPERIMENTAL_SILENCE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from llenvs_async.backends.vllm import VLLMBackend
    from llenvs_async.integrations.trl import environment_reward, rollout_func
    from llenvs_async.models import fetch_model

    model_dir = fetch_model("smollm2-135m-instruct")
    easy = load_example("easy_tasks.py")
    tasks = tmp_path / "tasks"
    easy.write_task(tasks, easy.KINDS[5], "delta")  # rename: the defaults solve it half the time
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    @contextlib.asynccontextmanager
    async def make_runner() -> AsyncIterator[TrajectoryRunner]:
        async with HarborAdapter(cache_dir=tmp_path / "cache") as adapter:

            async def env_factory() -> Any:
                return await adapter.get_environment(tasks, max_steps=3)

            backend = VLLMBackend.from_engine_args(
                str(model_dir), enforce_eager=True, max_model_len=2048, dtype="float32", seed=0
            )
            async with await env_factory() as env, backend:
                yield TrajectoryRunner(
                    env,
                    backend,
                    SamplingParams(max_tokens=48, temperature=0.7, logprobs=0),
                    env_factory=env_factory,
                    token_mode=True,
                )

    config = cpu_grpo_config(tmp_path / "out", max_steps=2, learning_rate=1e-5)
    dataset = datasets.Dataset.from_dict({"prompt": ["easy-rename-delta"] * 4})
    batches: list[list[Any]] = []
    with rollout_func(make_runner) as rollouts:

        def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            out = rollouts(prompts, trainer)
            batches.append(rollouts.last_trajectories)
            return out

        trainer = trl.GRPOTrainer(
            model=model,
            # A small brevity term keeps every group's rewards apart: at 48 tokens the
            # model often fails all 4 renames, and a constant group moves nothing.
            reward_funcs=[environment_reward, _brevity],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=recorded,
        )
        trainer.train()
    assert task_containers() == []

    assert trainer.state.global_step == 2 and len(batches) == 2
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter moved: the optimizer steps did not use our rollouts"
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    for version, (entry, trajectories) in enumerate(zip(logs, batches, strict=True)):
        assert all(t.error is None and t.transitions for t in trajectories)
        # the engine's own samples, under the weights of the step that asked for them
        assert all(set(t.policy_versions) == {version} for t in trajectories)
        rewards = [t.total_reward for t in trajectories]
        assert set(rewards) <= {0.0, 1.0}  # the verifier's verdict
        assert entry["rewards/environment_reward/mean"] == pytest.approx(sum(rewards) / 4)
