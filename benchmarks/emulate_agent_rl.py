"""The relay RL loop without the engine or containers, for tuning, not for results.

``examples/train_agent_rl.py`` costs ~23 s a step here (GRPO, 32 episodes; vine several
times more) and holds both cores, so a sweep of its knobs over seeds takes many hours; this
takes 11-20 s a step on one core at the loop's defaults, two seeds at once. It keeps what
decides learning: the same tiny
model, warm-up and ``AgentPolicy.train`` update (PPO-clip, KL, ramp, clipping), staleness 1,
the relay tasks' own transition rule (``agent_tasks.apply``), GRPO's normalisation and the
TD errors of vine, and the exact held-out success of ``exact_success``. It samples a command
from the trainer's probability of each listed call (``call_probabilities``) instead of
generating tokens. A reply that is none of them (the rest of the mass) wastes the action
and, as in the real loop, gets -1 on the token where it left the call syntax: the reply
is sampled from the trainer's model until it is not a listed call (the engine would have
sampled it from the policy one update older). Vine's values are exact (the policy's
success probability from each state, ``--K 0``) or means of K sampled rollouts, as
``estimate_values`` would measure them. Each line shows ``listed``: the listed calls'
mean probability over the train tasks' file sets, and ``train-exact`` the exact success on the
loop's 8 train names (against ``exact``'s held-out ones). ``--policy tabular`` swaps the model
for a table of logits per file set (``run_tabular``): the estimators' credit alone.

    python benchmarks/emulate_agent_rl.py [--estimator grpo|vine] [--K 0] [--steps 40]
        [--seeds 0 1 2] [--lr 3e-4] [--groups 4] [--group-size 4] [--policy model|tabular]
        [--reads-listing 0.75] [--more-names 0] [--warmup-seed S]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import agent_tasks as relay
import train_agent_rl as loop

# Train names beyond the loop's 8, for ``--more-names`` (none is a held-out name).
MORE_NAMES = (
    "anvil", "basil", "cobalt", "dune", "elm", "flint", "garnet", "hazel", "iris", "juniper",
    "kelp", "larch", "maple", "nickel", "onyx", "pine", "quartz", "raven", "sable", "thyme",
    "umber", "violet", "willow", "yarrow",
)  # fmt: skip


def pick(probs: tuple[float, ...], rng: random.Random) -> int | None:
    """A listed command's index, or None for the rest of the mass (a wasted action)."""
    x = rng.random()
    for c, p in enumerate(probs):
        x -= p
        if x < 0:
            return c
    return None


def episode(
    choice: dict[relay.Files, tuple[float, ...]], rng: random.Random
) -> tuple[list[tuple[relay.Files, int | None]], float]:
    files, steps = relay.START, []
    for _ in range(relay.MAX_ACTIONS):
        c = pick(choice[files], rng)  # once solved, every command fails: files stay
        steps.append((files, c))
        files = files if c is None else relay.apply(files, c)
    return steps, float(files == {"out"})


def value(
    choice: dict[relay.Files, tuple[float, ...]],
    files: relay.Files,
    left: int,
    k: int,
    rng: random.Random,
) -> float:
    """V(files, actions left): exact (k = 0) or the mean of k sampled rollouts."""
    if left == 0 or files == {"out"}:
        return float(files == {"out"})
    if k == 0:
        return relay.expected_success(choice, actions=left, start=files)
    wins = 0
    for _ in range(k):
        f = files
        for _ in range(left):
            c = pick(choice[f], rng)
            f = f if c is None else relay.apply(f, c)
        wins += f == {"out"}
    return wins / k


def advantages(
    batch: list[tuple[str, list[Any]]],
    estimator: str,
    choices: dict[str, Any],
    k: int,
    rng: random.Random,
) -> list[tuple[str, relay.Files, int | None, float]]:
    """(task, files, command, advantage) for every step the batch ran; a reply off the
    listed calls (command None) gets ``FORMAT_ADVANTAGE``, as ``penalise_format_errors``
    gives it in the loop (after vine's whitening)."""
    out: list[tuple[str, relay.Files, int | None, float]] = []
    if estimator == "grpo":
        for name, group in batch:
            returns = [r for _, r in group]
            mean, std = statistics.fmean(returns), statistics.pstdev(returns)
            out += [(name, f, c, (r - mean) / (std + 1e-4))
                    for steps, r in group for f, c in steps]  # fmt: skip
        return [(n, f, c, a if c is not None else loop.FORMAT_ADVANTAGE) for n, f, c, a in out]
    cache: dict[tuple[str, relay.Files, int], float] = {}

    def v(name: str, files: relay.Files, left: int) -> float:
        if (name, files, left) not in cache:
            cache[name, files, left] = value(choices[name], files, left, k, rng)
        return cache[name, files, left]

    for name, group in batch:
        for steps, r in group:
            for t, (f, c) in enumerate(steps):
                left = relay.MAX_ACTIONS - t
                after = f if c is None else relay.apply(f, c)
                td = (r if left == 1 else v(name, after, left - 1)) - v(name, f, left)
                out.append((name, f, c, td))
    std = statistics.pstdev(a for *_, a in out) if len(out) > 1 else 0.0
    # whitened, as the loop does, then the off-call replies penalised
    return [(n, f, c, a / (std + 1e-4) if c is not None else loop.FORMAT_ADVANTAGE)
            for n, f, c, a in out]  # fmt: skip


def off_call_reply(policy: Any, prompt: list[int], rng: random.Random) -> list[int] | None:
    """A reply sampled from the trainer's model that is none of the listed calls (up to 4
    batches of 32 samples; None if every one was a listed call)."""
    import torch

    torch.manual_seed(rng.randrange(2**31))
    longest = max(len(c) for c in policy.calls)
    eos = policy.calls[0][-1]
    ids = torch.tensor([prompt])
    for _ in range(4):
        with torch.no_grad():
            out = policy.model.generate(
                ids, do_sample=True, top_k=0, max_new_tokens=longest + 4,
                num_return_sequences=32, pad_token_id=eos,
            )  # fmt: skip
        for row in out[:, len(prompt) :].tolist():
            reply = row[: row.index(eos) + 1] if eos in row else row
            if reply not in policy.calls:
                return reply
    return None


def run(args: argparse.Namespace, seed: int) -> list[float]:
    """One run; prints a line per step and returns the exact held-out success curve."""
    from llenvs_async.testing.tiny_model import cached_tiny_model

    warmup_seed = seed if args.warmup_seed is None else args.warmup_seed
    cfg = loop.Config(
        seed=warmup_seed, lr=args.lr, lr_floor=args.lr_floor, steps=args.steps,
        warmup_reads_listing=args.reads_listing,
    )  # fmt: skip
    policy = loop.AgentPolicy(str(cached_tiny_model()), cfg, [loop.BASH_TOOL])
    train_names = relay.TRAIN_NAMES + MORE_NAMES[: args.more_names]
    policy.warm_up(loop.warmup_observations(train_names, warmup_seed))
    curve = [loop.exact_success(policy, relay.HELDOUT_NAMES)[0]]
    rng, start = random.Random(seed), time.monotonic()
    sampling = {n: loop.call_logprobs(policy, n) for n in train_names}
    for step in range(args.steps):
        # sampling lags one update: staleness 1
        current = {n: loop.call_logprobs(policy, n) for n in train_names}
        choices = {n: loop.call_probabilities(t) for n, t in sampling.items()}
        names = [rng.choice(train_names) for _ in range(args.groups)]
        batch = [(n, [episode(choices[n], rng) for _ in range(args.group_size)]) for n in names]
        samples = []
        for name, files, c, a in advantages(batch, args.estimator, choices, args.K, rng):
            prompt = policy.prompt_ids(loop.state_prompt(name, files))
            info: dict[str, str] = {}
            if c is None:  # its old logprobs are the trainer's: ratio 1, no staleness
                reply = off_call_reply(policy, prompt, rng)
                if reply is None:
                    continue
                (lp,) = policy.logprobs([(prompt, reply)])
                tokens, old, info = reply, lp.detach().tolist(), {"parse_error": "off-call"}
            else:
                tokens, old = policy.calls[c], sampling[name][files][c].tolist()
            done = SimpleNamespace(prompt_token_ids=prompt, token_ids=tokens, logprobs=old)
            samples.append((SimpleNamespace(completion=done, info=info), a))
        clipped, drift = policy.train(samples) if samples else (0.0, 0.0)
        sampling = current
        exact, rm = loop.exact_success(policy, relay.HELDOUT_NAMES)
        trained, _ = loop.exact_success(policy, relay.TRAIN_NAMES)  # the loop's 8: comparable
        curve.append(exact)
        success = statistics.fmean(r for _, g in batch for _, r in g)
        listed = statistics.fmean(sum(p) for t in choices.values() for p in t.values())
        print(f"[{args.estimator} seed {seed}] step {step:3d}  success {success:.2f}  exact "
              f"{exact:.2f}  train-exact {trained:.2f}  p(rm-first) {rm:.2f}  listed "
              f"{listed:.2f}  clipped {clipped:.2f}  "
              f"drift {drift:.3f}  {time.monotonic() - start:5.0f}s", flush=True)  # fmt: skip
    return curve


def run_tabular(args: argparse.Namespace, seed: int) -> list[float]:
    """The control: a softmax table per file set instead of the model (it tells every state
    apart, and nothing else), updated by plain policy-gradient steps of size ``--lr`` on
    the same batches and advantages. What it shows is the estimators' credit alone."""
    rng = random.Random(seed)
    states = relay.reachable()
    logits = {f: [0.0, 0.0, 0.0] for f in states}

    def table() -> dict[relay.Files, tuple[float, ...]]:
        out = {}
        for f, z in logits.items():
            e = [math.exp(x - max(z)) for x in z]
            out[f] = tuple(x / sum(e) for x in e)
        return out

    curve = [relay.expected_success(table())]
    for step in range(args.steps):
        choices = table()
        names = [rng.choice(relay.TRAIN_NAMES) for _ in range(args.groups)]
        batch = [(n, [episode(choices, rng) for _ in range(args.group_size)]) for n in names]
        samples = advantages(batch, args.estimator, dict.fromkeys(names, choices), args.K, rng)
        for _, files, c, a in samples:
            assert c is not None  # the table has no mass off the listed calls
            for i, p in enumerate(choices[files]):
                logits[files][i] += args.lr * a * ((i == c) - p) / len(samples)
        curve.append(relay.expected_success(table()))
        print(f"[{args.estimator} tabular seed {seed}] step {step:3d}  exact {curve[-1]:.2f}  "
              f"p(rm-first) {table()[relay.START][2]:.2f}", flush=True)  # fmt: skip
    return curve


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--estimator", choices=("grpo", "vine"), default="grpo")
    parser.add_argument("--K", type=int, default=0, help="vine: rollouts per value (0: exact)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=loop.Config.lr)
    parser.add_argument(
        "--lr-floor", type=float, default=loop.Config.lr_floor,
        help="the rate decays linearly to lr times this over --steps (1: constant)",
    )  # fmt: skip
    parser.add_argument("--groups", type=int, default=loop.Config.groups_per_step)
    parser.add_argument("--group-size", type=int, default=loop.Config.group_size)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--more-names", type=int, default=0,
        help=f"train (and warm up) on up to {len(MORE_NAMES)} more names than the loop's 8",
    )  # fmt: skip
    parser.add_argument(
        "--reads-listing", type=float, default=loop.Config.warmup_reads_listing,
        help="share of warm-up labels paired with a listing that has the command's file",
    )  # fmt: skip
    parser.add_argument(
        "--warmup-seed", type=int, default=None,
        help="the warm-up's seed (default: the run's): crossing it with --seeds tells "
        "the warm-up's draw from RL's",
    )  # fmt: skip
    parser.add_argument(
        "--policy", choices=("model", "tabular"), default="model",
        help="tabular: a logit table per file set (the estimators' control)",
    )  # fmt: skip
    args = parser.parse_args()
    if not 0 <= args.more_names <= len(MORE_NAMES):
        parser.error(f"--more-names: {args.more_names} is not in 0..{len(MORE_NAMES)}")
    torch.set_num_threads(args.threads)
    for seed in args.seeds:
        curve = run(args, seed) if args.policy == "model" else run_tabular(args, seed)
        every = " ".join(f"{x:.2f}" for x in curve[::10])
        print(f"[{args.estimator} seed {seed}] exact held-out every 10 steps: {every}; "
              f"last {curve[-1]:.2f}, best {max(curve):.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
