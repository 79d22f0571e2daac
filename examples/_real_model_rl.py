"""Agentic RL from a real model: SmolLM2-135M-Instruct learns the easy task family in containers.

    python examples/train_agent_rl.py --model smollm2-135m-instruct [--estimator grpo|vine|both]
                                      [--seed 0 1] [--steps N] [--device cpu|cuda] [--out F]

The policy is the real model (``llenvs-async models fetch``) acting through the CLI's text
harness (system prompt, example turns, the stop string after the first closed block) on the
tasks of ``easy_tasks.py``: six kinds of one-command task, trained on two names and evaluated
on two others. Every episode runs in its own container, in token mode, so the trainer scores
exactly the ids the engine sampled.

Full fine-tuning, not LoRA: 135M parameters with Adam's moments take ~2.2 GB, which a laptop
has, and the whole model reaches the engine by ``update_weights`` with no adapter merge per
step (``peft`` would save memory nobody here is short of, and add a dependency).

Training rollouts sample at temperature 0.6 (at 1 most replies are prose or cut off; at the
default 0.2 a group often agrees entirely and teaches nothing), and the trainer's logprobs
are of that tempered distribution. The held-out evaluation samples at the CLI's defaults
(``ModelSpec``: T=0.2, top_p 0.9) with the same rollout ids every time, so before and after
are paired draws.

Advantages, as in ``train_agent_rl``: ``grpo`` (normalised within one task's group) or
``vine`` (per-step TD errors of Monte Carlo values of every distinct live state, restored by
replaying the action prefix in a fresh container). Loss: policy gradient, token mean, one
optimizer step per batch, gradient norm clipped at 1.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling examples, as modules

import easy_tasks as easy
import train_agent_rl as agent
from _agent_rl_logprobs import shared_prefix_logprobs

from llenvs_async import SamplingParams, Trajectory, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, harbor_restore
from llenvs_async.estimation import ValueEstimate, summarize_returns
from llenvs_async.models import KNOWN_MODELS, fetch_model
from llenvs_async.types import Transition

# Rollout numbers (their sampling seeds follow them): a run of seed S numbers its episodes
# from S * SEED_IDS and its value rollouts from VALUE_IDS further on.
SEED_IDS = 10**10
VALUE_IDS = 10**9


@dataclass
class Config:
    """Knobs of one run; ``quick()`` is the test suite's."""

    model: str = "smollm2-135m-instruct"
    steps: int = 20
    groups_per_step: int = 6  # tasks per step, of the 12 train tasks
    group_size: int = 4
    max_actions: int = 3  # a command and SUBMIT, one to spare
    lr: float = 1e-5
    # training rollouts (the evaluation samples at the model's defaults): at 1.0 most replies
    # of this model are prose or cut off, at its default 0.2 a group often agrees entirely
    temperature: float = 0.6
    max_tokens: int = 96  # a reply that parses is 10-30 tokens; longer ones are cut off anyway
    value_rollouts: int = 4  # per distinct live state (vine)
    eval_per_task: int = 4  # held-out episodes per held-out task, per evaluation
    eval_every: int = 5  # steps between held-out evaluations (before and after always)
    concurrency: int = 24  # containers alive at once
    micro_batch: int = 4  # (prompt, completion) pairs per forward/backward (memory)
    device: str = "cpu"
    seed: int = 0

    @classmethod
    def quick(cls) -> Config:
        """One step of every phase per estimator, in about three minutes on 2 cores."""
        return cls(steps=1, groups_per_step=2, group_size=2, value_rollouts=2,
                   eval_per_task=1, eval_every=0, concurrency=8)  # fmt: skip


@dataclass
class StepLog:
    step: int
    success: float  # of the batch's episodes
    format_errors: float  # share of the batch's replies that did not parse
    failed: int  # rollouts that ended in an error (left out of the update)
    rollouts: int  # so far, value estimation included
    rollout_s: float  # wall seconds of this step's phases
    value_s: float
    train_s: float
    sync_s: float
    loss: float


@dataclass
class RunResult:
    estimator: str
    seed: int
    steps: list[StepLog] = field(default_factory=list)
    # (optimizer step, wall seconds, held-out success, 95% interval low, high)
    curve: list[tuple[int, float, float, float, float]] = field(default_factory=list)
    kinds_before: dict[str, float] = field(default_factory=dict)  # held-out success by kind
    kinds_after: dict[str, float] = field(default_factory=dict)

    @property
    def before(self) -> float:
        return self.curve[0][2]

    @property
    def after(self) -> float:
        return self.curve[-1][2]


class RealPolicy:
    """The trainer's copy of the model (fp32, full fine-tuning) and its optimizer."""

    def __init__(self, model_dir: str, cfg: Config) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(cfg.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)

    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Any]:
        """Per-token logprobs of the distribution the engine sampled (logits / temperature)."""
        return shared_prefix_logprobs(self.model, pairs, self.cfg.temperature)

    def train(self, samples: Sequence[tuple[Transition, float]]) -> float:
        """One policy-gradient step, -mean(A * log pi_T(token)) over the batch's tokens, in
        micro-batches; returns the loss. On-policy and one step per batch, PPO's clipped
        ratio would be 1 with this very gradient, so it is left out; the logprobs are the
        trainer's own at the sampling temperature (the engine reports untempered ones)."""
        import torch

        pairs = [(t.completion.prompt_token_ids, t.completion.token_ids) for t, _ in samples]  # type: ignore[union-attr]
        tokens = sum(len(c) for _, c in pairs)
        self.optimizer.zero_grad()
        loss = 0.0
        for start in range(0, len(pairs), self.cfg.micro_batch):
            rows = range(start, min(start + self.cfg.micro_batch, len(pairs)))
            new = self.logprobs([pairs[i] for i in rows])
            part = -sum(float(samples[i][1]) * lp.sum() for lp, i in zip(new, rows, strict=True))
            (part / tokens).backward()
            loss += float(part.detach()) / tokens
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return loss


def usable(batch: Sequence[Trajectory]) -> list[Trajectory]:
    """The rollouts that ended without an error (a failed one is reported, not trained on)."""
    return [t for t in batch if t.error is None]


def success_by_kind(batch: Sequence[Trajectory], names: Sequence[str]) -> dict[str, float]:
    """Held-out success per task kind (write, mkdir, ...): where learning happened."""
    wins: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for t in batch:
        kind = names[int(t.initial_state.task)].split("-")[1]  # type: ignore[arg-type]
        runs[kind] += 1
        wins[kind] += bool(t.success)
    return {k: wins[k] / runs[k] for k in sorted(runs)}


async def evaluate(
    runner: TrajectoryRunner, tasks: int, cfg: Config
) -> tuple[ValueEstimate, list[Trajectory]]:
    """Held-out success with its 95% interval; the same rollout ids (and seeds) every call."""
    inputs = [t for t in range(tasks) for _ in range(cfg.eval_per_task)]
    batch = await runner.run_batch(inputs, cfg.concurrency)
    wins = [float(bool(t.success)) for t in batch]
    return summarize_returns(wins, reward_range=(0.0, 1.0)), batch


async def train(
    estimator: str,
    cfg: Config,
    backend: Any,
    model_dir: str,
    runners: tuple[TrajectoryRunner, TrajectoryRunner],
    names: tuple[Sequence[str], Sequence[str]],
    saved: Callable[[RunResult], None] = lambda _: None,
) -> RunResult:
    """Evaluate, run ``cfg.steps`` RL steps (evaluating every ``eval_every``), evaluate;
    ``saved(result)`` after every step and evaluation (a killed run keeps what it did)."""
    train_runner, eval_runner = runners
    train_names, heldout_names = names
    policy = RealPolicy(model_dir, cfg)
    version = (backend.policy_version or 0) + 1
    await backend.update_weights(policy.model.named_parameters(), version=version, mode="wait")
    tag = f"[{cfg.model} {estimator} seed {cfg.seed}]"
    result = RunResult(estimator, cfg.seed)
    start = time.monotonic()

    async def checkpoint(step: int) -> list[Trajectory]:
        est, batch = await evaluate(eval_runner, len(heldout_names), cfg)
        result.curve.append((step, time.monotonic() - start, est.mean, est.ci_low, est.ci_high))
        saved(result)
        print(f"{tag} after {step} steps: held-out success {est.mean:.2f} "
              f"[{est.ci_low:.2f}, {est.ci_high:.2f}] (n={est.n})", flush=True)  # fmt: skip
        return batch

    result.kinds_before = success_by_kind(await checkpoint(0), heldout_names)
    rng = random.Random(cfg.seed)
    base = cfg.seed * SEED_IDS  # each seed's rollouts draw their own samples
    rollouts = 0
    per_step = cfg.groups_per_step * cfg.group_size
    for step in range(cfg.steps):
        t0 = time.monotonic()
        tasks = rng.sample(range(len(train_names)), cfg.groups_per_step)
        inputs = [t for t in tasks for _ in range(cfg.group_size)]
        ids = range(base + step * per_step, base + (step + 1) * per_step)  # fresh seeds
        batch = await train_runner.run_batch(inputs, cfg.concurrency, rollout_ids=list(ids))
        rollouts += len(batch)
        t1 = time.monotonic()
        groups = [usable(batch[i : i + cfg.group_size]) for i in range(0, per_step, cfg.group_size)]
        if estimator == "grpo":
            samples = [s for g in groups if g for s in agent.grpo_advantages(g)]
        else:
            kept = [t for g in groups for t in g]
            first = base + VALUE_IDS + rollouts  # apart from the episodes' numbers
            raw, extra = (
                await agent.vine_advantages(
                    train_runner, kept, cfg.value_rollouts, first, cfg.concurrency
                )
                if kept
                else ([], 0)
            )
            # a state whose value rollouts all failed has no value (NaN): leave its steps out
            samples = agent.whiten([(tr, a) for tr, a in raw if math.isfinite(a)])
            rollouts += extra
        t2 = time.monotonic()
        loss = await asyncio.to_thread(policy.train, samples) if samples else 0.0
        t3 = time.monotonic()
        version += 1
        await backend.update_weights(policy.model.named_parameters(), version=version, mode="wait")
        log = StepLog(
            step=step, success=sum(bool(t.success) for t in batch) / len(batch),
            format_errors=agent.format_error_rate(batch),
            failed=sum(t.error is not None for t in batch),
            rollouts=rollouts, rollout_s=t1 - t0, value_s=t2 - t1, train_s=t3 - t2,
            sync_s=time.monotonic() - t3, loss=loss,
        )  # fmt: skip
        result.steps.append(log)
        saved(result)
        print(f"{tag} step {step:3d}  success {log.success:.2f}  format-errors "
              f"{log.format_errors:.2f}  failed {log.failed}  rollouts {rollouts:5d}  "
              f"loss {loss:+.4f}  seconds: rollouts {log.rollout_s:.0f} "
              f"values {log.value_s:.0f} train {log.train_s:.0f} sync {log.sync_s:.0f}",
              flush=True)  # fmt: skip
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            await checkpoint(step + 1)
    if cfg.steps:
        result.kinds_after = success_by_kind(await checkpoint(cfg.steps), heldout_names)
    return result


def engine_backend(model_dir: str, cfg: Config) -> Any:
    from llenvs_async.backends.vllm import VLLMBackend

    gpu = {"gpu_memory_utilization": 0.3} if cfg.device.startswith("cuda") else {}  # + trainer
    return VLLMBackend.from_engine_args(
        model_dir, dtype="float32", enforce_eager=True, max_model_len=4096, seed=cfg.seed, **gpu
    )


async def run_all(
    estimators: Sequence[str], seeds: Sequence[int], cfg: Config, out: Path | None = None
) -> list[RunResult]:
    """Every (seed, estimator) run from the same pretrained weights, on one engine; the runs
    so far are written to ``out`` (JSON, ``save``) after every step."""
    model_dir = str(fetch_model(cfg.model))
    spec = KNOWN_MODELS[cfg.model]
    train_params = SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                  seed=cfg.seed)  # fmt: skip
    eval_params = SamplingParams(max_tokens=spec.max_tokens, temperature=spec.temperature,
                                 top_p=spec.top_p, seed=cfg.seed)  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="easy-tasks-") as root:
        train_dir, heldout_dir = easy.build_tasks(root)
        async with engine_backend(model_dir, cfg) as backend, HarborAdapter() as adapter:

            async def train_env() -> Any:
                return await adapter.get_environment(train_dir, max_steps=cfg.max_actions)

            async def heldout_env() -> Any:
                return await adapter.get_environment(heldout_dir, max_steps=cfg.max_actions)

            names = [
                [task.name.rpartition("/")[2] for task in (await adapter.get_dataset(d)).tasks]
                for d in (train_dir, heldout_dir)
            ]
            async with await train_env() as env, await heldout_env() as eval_env:
                train_runner = TrajectoryRunner(
                    env, backend, train_params, env_factory=train_env,
                    restore_fn=harbor_restore, token_mode=True,
                )  # fmt: skip
                eval_runner = TrajectoryRunner(
                    eval_env, backend, eval_params, env_factory=heldout_env, token_mode=True
                )
                async with train_runner, eval_runner:
                    for seed in seeds:
                        for estimator in estimators:
                            run_cfg = Config(**{**vars(cfg), "seed": seed})
                            done = list(results)

                            def saved(current: RunResult, done: list[RunResult] = done) -> None:
                                if out is not None:
                                    save([*done, current], cfg, out)

                            results.append(await train(
                                estimator, run_cfg, backend, model_dir,
                                (train_runner, eval_runner), (names[0], names[1]), saved,
                            ))  # fmt: skip
    return results


def save(results: Sequence[RunResult], cfg: Config, path: Path) -> None:
    """The runs as JSON: the config, every step's log and the held-out curve."""
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = [{**asdict(r), "before": r.curve[0][2] if r.curve else None,
             "after": r.curve[-1][2] if r.curve else None} for r in results]  # fmt: skip
    path.write_text(json.dumps({"config": asdict(cfg), "runs": runs}, indent=1) + "\n")
