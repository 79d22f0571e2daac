"""GRPO vs Monte Carlo (VinePPO-style) advantages on the relay container tasks: one command.

Runs ``examples/train_agent_rl.py``'s loop for every (seed, estimator), evaluating held-out
success every ``--eval-every`` steps, and writes ``benchmarks/results/agent_rl.md`` (a
table: held-out success before/after with a 95% t-interval over seeds, rollouts and wall
time, first step at >= 0.7, and the exact held-out success of ``exact_success``, which has
no sampling noise) and ``agent_rl.png`` (held-out success vs optimizer steps, vs
rollouts consumed and vs wall time; mean over seeds with the interval as a band).

``--restore`` instead measures what V(s) costs per restore on these tasks: bringing a fresh
environment to a saved mid-episode state by replay (reset + re-run the actions), by snapshot
fork (``SnapshotRestore``: replay once, commit, start later copies from the snapshot) and by
gVisor fork (``SnapshotRestore(processes=True)`` under ``runtime="gvisor"``).

    python benchmarks/bench_agent_rl.py [--seeds 3] [--first-seed 0] [--steps N]
                                        [--estimator both] [--value-rollouts K]
                                        [--name STEM] [--quick]
    python benchmarks/bench_agent_rl.py --combine A.json B.json ... [--name STEM]
    python benchmarks/bench_agent_rl.py --restore [--repeats 4]

A long sweep can run one seed per command (``--seeds 1 --first-seed S --name STEM_sS``), each
writing its own JSON as it ends, and ``--combine`` then writes the table and plot of them all:
a sweep cut off part-way keeps the seeds it finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.7
# two-sided 95% Student t quantiles by degrees of freedom (n - 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval, cut to the success range [0, 1] (a point for a single
    value): with 3 seeds the t-interval alone can reach past both ends."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    t = _T95.get(len(values) - 1, 1.96)
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def exact(run: Any) -> list[float]:
    """The run's exact held-out success after the warm-up and every update; runs written
    before it was recorded have none."""
    return list(getattr(run, "exact", None) or [])


def table(results: Sequence[Any], estimators: Sequence[str]) -> str:
    """The markdown table, one row per estimator (means over seeds)."""
    rows = [
        "| estimator | seeds | held-out before | held-out after | exact after | rollouts | "
        f"wall s | steps to {TARGET} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for est in estimators:
        runs = [r for r in results if r.estimator == est]
        before, b_lo, b_hi = interval([r.before for r in runs])
        after, a_lo, a_hi = interval([r.after for r in runs])
        exact_after = "-"  # a mean only over every run: a partial one would mislead
        if all(exact(r) for r in runs):
            e, e_lo, e_hi = interval([exact(r)[-1] for r in runs])
            exact_after = f"{e:.2f} [{e_lo:.2f}, {e_hi:.2f}]"
        rollouts = statistics.fmean(r.curve[-1][1] for r in runs)
        seconds = statistics.fmean(r.curve[-1][2] for r in runs)
        hits = [next((c[0] for c in r.curve if c[3] >= TARGET), None) for r in runs]
        reached = ", ".join("-" if h is None else str(h) for h in hits)
        rows.append(
            f"| {est} | {len(runs)} | {before:.2f} [{b_lo:.2f}, {b_hi:.2f}] | "
            f"{after:.2f} [{a_lo:.2f}, {a_hi:.2f}] | {exact_after} | "
            f"{rollouts:.0f} | {seconds:.0f} | {reached} |"
        )
    return "\n".join(rows)


def seeds_table(results: Sequence[Any]) -> str:
    """One row per run: held-out success at every evaluation, so a mean hides no seed, and
    the exact success before and after."""
    points = sorted({c[0] for r in results for c in r.curve})
    rows = [
        "| estimator | seed | " + " | ".join(f"step {p}" for p in points) + " | best | exact |",
        "|---|---|" + "---|" * (len(points) + 2),
    ]
    for r in results:
        at = {c[0]: c[3] for c in r.curve}
        cells = " | ".join("-" if p not in at else f"{at[p]:.2f}" for p in points)
        e = exact(r)
        moved = f"{e[0]:.2f} -> {e[-1]:.2f}" if e else "-"
        rows.append(f"| {r.estimator} | {r.seed} | {cells} | {max(at.values()):.2f} | {moved} |")
    return "\n".join(rows)


def plot(results: Sequence[Any], estimators: Sequence[str], out: Path) -> None:
    """Held-out success vs steps, rollouts and wall time (mean over seeds, 95% band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for est in estimators:
        runs = [r for r in results if r.estimator == est]
        points = len(min((r.curve for r in runs), key=len))
        stats = [interval([r.curve[i][3] for r in runs]) for i in range(points)]
        mean = [m for m, _, _ in stats]
        lo = [low for _, low, _ in stats]
        hi = [high for _, _, high in stats]
        for ax, col in zip(axes, (0, 1, 2), strict=True):
            xs = [statistics.fmean(r.curve[i][col] for r in runs) for i in range(points)]
            ax.plot(xs, mean, marker="o", label=est)
            ax.fill_between(xs, lo, hi, alpha=0.2)
    for ax, label in zip(axes, ("optimizer steps", "rollouts consumed", "wall s"), strict=True):
        ax.set_xlabel(label)
        ax.axhline(TARGET, color="grey", linestyle=":")
    axes[0].set_ylabel("held-out success")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


async def restore_costs(repeats: int) -> dict[str, dict[int, float]]:
    """Mean seconds per restore of a state after 1, 2 and 3 actions, ``repeats`` restores of
    each (as ``estimate_values`` does): by replay, by snapshot fork (runc: replay once,
    commit, start later copies from the image) and by gVisor fork (checkpoint the sandbox
    once, restore later copies with memory and processes)."""
    sys.path.insert(0, str(EXAMPLES))
    from agent_tasks import COMMANDS, build_tasks

    from llenvs_async import Action
    from llenvs_async.adapters.harbor import HarborAdapter, SnapshotRestore
    from llenvs_async.env import replay_restore

    def bash(command: str) -> Action:
        call = {"name": "bash", "arguments": json.dumps({"command": command})}
        return Action(text="", tool_calls=({"id": "c", "type": "function", "function": call},))

    ways: list[tuple[str, str, Any]] = [
        ("replay", "runc", lambda: replay_restore),
        ("snapshot fork", "runc", SnapshotRestore),
        ("gVisor fork", "gvisor", lambda: SnapshotRestore(processes=True)),
    ]
    costs: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="relay-tasks-") as root:
        train_dir, _ = build_tasks(root)
        for name, runtime, make in ways:
            restore = make()
            costs[name] = {}
            async with HarborAdapter(
                action_format="tools", warm_pool=0, runtime=runtime
            ) as adapter:
                for depth in (1, 2, 3):
                    source = await adapter.get_environment(train_dir, max_steps=4)
                    async with source:
                        state = await source.reset(depth)  # a different task per depth
                        for command in COMMANDS[:depth]:
                            state = (await source.step(state, bash(command))).next_state
                    seconds = []
                    for _ in range(repeats):
                        env = await adapter.get_environment(train_dir, max_steps=4)
                        async with env:
                            t0 = time.monotonic()
                            await restore(env, state)
                            seconds.append(time.monotonic() - t0)
                    costs[name][depth] = statistics.fmean(seconds)
                if hasattr(restore, "aclose"):
                    await restore.aclose()
    return costs


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--estimator", choices=("grpo", "vine", "both"), default="both")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--value-rollouts", type=int, default=None, help="per live state (vine)")
    parser.add_argument("--quick", action="store_true", help="the example's short config")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="agent_rl", help="stem of the .md/.png/.json written")
    parser.add_argument("--restore", action="store_true", help="measure restore costs only")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--combine", type=Path, nargs="+", help="merge these runs' JSON files")
    args = parser.parse_args(argv)
    if args.restore:
        rows = ["| restore | after 1 action | after 2 | after 3 |", "|---|---|---|---|"]
        for name, by_depth in (await restore_costs(args.repeats)).items():
            line = ", ".join(f"after {d} actions {s:.2f}s" for d, s in by_depth.items())
            print(f"restore by {name}: {line} (mean of {args.repeats})")
            rows.append(f"| {name} | " + " | ".join(f"{s:.2f} s" for s in by_depth.values()) + " |")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agent_rl_restore.md").write_text(
            "# Restoring a relay task's mid-episode state (seconds per restore)\n\n"
            f"Mean of {args.repeats} restores per state, into a fresh container (no warm pool).\n\n"
            + "\n".join(rows)
            + "\n"
        )
        return
    if args.combine:
        config, results = combine(args.combine)
    else:
        sys.path.insert(0, str(EXAMPLES))
        import train_agent_rl as loop

        cfg = loop.Config.quick() if args.quick else loop.Config()
        if args.steps is not None:
            cfg.steps = args.steps
        cfg.eval_every = args.eval_every
        if args.value_rollouts is not None:
            cfg.value_rollouts = args.value_rollouts
        estimators = ("grpo", "vine") if args.estimator == "both" else (args.estimator,)
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        results = await loop.run_all(estimators, seeds, cfg)
        config = {
            "steps": cfg.steps,
            "episodes_per_step": cfg.group_size * cfg.groups_per_step,
            "value_rollouts": cfg.value_rollouts,
            "heldout_episodes": cfg.eval_per_task * len(loop.HELDOUT_NAMES),
            "warmup_reads_listing": cfg.warmup_reads_listing,
            "lr_floor": cfg.lr_floor,
        }
    print(write(results, config, args.out, args.name))


def combine(paths: Sequence[Path]) -> tuple[dict[str, Any], list[Any]]:
    """The runs of several of this bench's JSON files, which must share one configuration."""
    config: dict[str, Any] | None = None
    results: list[Any] = []
    for path in paths:
        data = json.loads(path.read_text())
        if config is not None and data["config"] != config:
            raise SystemExit(f"{path}: config {data['config']} differs from {config}")
        config = data["config"]
        results += [SimpleNamespace(**run) for run in data["runs"]]
    assert config is not None  # argparse requires at least one path
    return config, results


def settings(config: dict[str, Any]) -> str:
    """The warm-up's share and the rate's floor, which runs written before them lack."""
    if "lr_floor" not in config:
        return ""
    return (
        f"Warm-up: {config['warmup_reads_listing']:g} of its labels with a listing that has the "
        f"command's input file; RL learning rate decaying to {config['lr_floor']:g} of itself "
        "(1: constant).\n\n"
    )


def write(results: Sequence[Any], config: dict[str, Any], out: Path, name: str) -> str:
    """Write ``name``.md (tables), .png (curves) and .json (every run's curve) under ``out``."""
    estimators = [e for e in ("grpo", "vine") if any(r.estimator == e for r in results)]
    seeds = len({r.seed for r in results})
    out.mkdir(parents=True, exist_ok=True)
    plot(results, estimators, out / f"{name}.png")
    text = (
        "# Agentic RL on the relay container tasks: GRPO vs Monte Carlo advantages\n\n"
        f"{seeds} seeds x {config['steps']} steps, {config['episodes_per_step']} episodes per "
        f"step, {config['value_rollouts']} value rollouts per live state (vine), "
        f"{config['heldout_episodes']} held-out episodes per evaluation; [lo, hi] is a 95% "
        "t-interval over seeds, cut to [0, 1].\n\n"
        + settings(config)
        + table(results, estimators)
        + "\n\nHeld-out success by run:\n\n"
        + seeds_table(results)
        + f"\n\n![held-out success]({name}.png)\n"
    )
    (out / f"{name}.md").write_text(text)
    runs = [
        {"estimator": r.estimator, "seed": r.seed, "before": r.before, "after": r.after,
         "curve": r.curve, "exact": exact(r)}
        for r in results
    ]  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps({"config": config, "runs": runs}, indent=1) + "\n")
    return text


if __name__ == "__main__":
    asyncio.run(main())
