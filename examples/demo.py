"""Demo: Monte Carlo Q-values on the bundled Harbor tasks, in real Docker containers.

A scripted epsilon-oracle agent (llenvs_async.adapters.harbor.harbor_oracle: the task's
solution/solve.sh line by line, but with probability epsilon a wrong or destructive
command) collects trajectories. Mid-trajectory states are saved to JSONL and loaded
back; from each, rollouts in fresh containers (restored by replay with
harbor_restore) estimate Q(s, the correct next command) and Q(s, a destructive
command). Prints the table, writes the plot, checks that no container is left.

    python examples/demo.py [--out demo-output] [--rollouts 16] [--epsilon 0.15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

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
from llenvs_async.policies import shell_reply
from llenvs_async.serialization import from_dict, to_dict

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASKS = ("csv-totals", "organize-files", "build-release")


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


def _partner(rows: Sequence[tuple[str, State, str, ValueEstimate]], task: str) -> ValueEstimate:
    return next(q for t, _, a, q in rows if t == task and a == HARBOR_DESTRUCTIVE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts per Q estimate")
    parser.add_argument("--epsilon", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4, help="containers alive at once")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(run(args.out, args.rollouts, args.epsilon, args.seed, args.batch_size)))


if __name__ == "__main__":
    main()
