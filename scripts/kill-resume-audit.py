"""SIGKILL ``llenvs-async run`` at random points, resume it, compare with a run never killed.

    .venv/bin/python scripts/kill-resume-audit.py --kills 10 --out benchmarks/results/kill_resume.md

The run is the one issue 53 reported: a seeded epsilon oracle over three of the bundled container
tasks (``-n 4 -c 3 --epsilon 0.4 --seed 11``). One uninterrupted run gives the reference and its
wall time; each kill point is drawn uniformly over that time. After a kill, ``llenvs-async
cleanup`` removes what the dead process left, ``--resume`` finishes the file, and every (task,
rollout) must hold the reference's actions and reward; no container of the killed or the resuming
process may be left. Rollouts in flight at the kill continue from their last journaled step
(``info["resumed_at_step"]``). ``--faults`` adds two more: the Docker engine stopped and
restarted mid-run (its failed rollouts retried with ``--resume --retry-failed``), and the
results file's disk full (the run stops; resumed once there is room).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLI = (sys.executable, "-m", "llenvs_async.cli")
ARGS = ("run", str(ROOT / "examples" / "tasks"), "--limit", "3", "-n", "4", "-c", "3",
        "--epsilon", "0.4", "--seed", "11", "-q")  # fmt: skip


def resumed_steps(path: Path) -> tuple[int, int]:
    """How many trajectories were continued mid-episode, and the steps they did not redo."""
    from llenvs_async.cli._results import load_results, unique_by_key

    at = [r.trajectory.info.get("resumed_at_step", 0) for r in unique_by_key(load_results(path))]
    return sum(1 for n in at if n), sum(at)


def runs(path: Path) -> dict[tuple[Any, int], tuple[tuple[str, ...], float]]:
    """Each (task, rollout)'s actions and return, the last record per key winning."""
    from llenvs_async.cli._results import load_results, unique_by_key

    return {
        r.key: (tuple(a.text for a in r.trajectory.actions), r.trajectory.total_reward)
        for r in unique_by_key(load_results(path))
    }


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def containers_of(pid: int) -> int:
    import socket

    from llenvs_async._ownership import OWNER_LABEL
    from llenvs_async.docker.engine import DockerEngine

    async with DockerEngine() as engine:
        return len(await engine.list_containers({OWNER_LABEL: f"{socket.gethostname()}:{pid}"}))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=600)


def one_kill(work: Path, delay: float, reference: dict[Any, Any]) -> dict[str, Any]:
    out = work / f"killed-{delay:.2f}.jsonl"
    proc = subprocess.Popen([*CLI, *ARGS, "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(delay)
    killed = proc.poll() is None
    proc.kill()
    proc.wait()
    saved = lines(out)
    live = asyncio.run(containers_of(proc.pid))
    cleaned = cli("cleanup")
    left_after_cleanup = asyncio.run(containers_of(proc.pid))
    resumed = cli(*ARGS, "-o", str(out), "--resume")
    got = runs(out)
    differing = sorted(k for k in reference if got.get(k) != reference[k])
    continued, kept = resumed_steps(out)
    return {
        "fault": "SIGKILL",
        "delay_s": round(delay, 2),
        "killed_mid_run": killed,
        "saved_before_kill": saved,
        "containers_at_kill": live,
        "left_after_cleanup": left_after_cleanup + (cleaned.returncode != 0),
        "resume_exit": resumed.returncode,
        "keys": len(got),
        "differing": len(differing),
        "continued": continued,
        "steps_kept": kept,
    }


def engine_restart(work: Path, delay: float, reference: dict[Any, Any]) -> dict[str, Any]:
    """Stop dockerd ``delay`` s into the run, start it again, retry the failed rollouts."""
    out = work / f"engine-{delay:.2f}.jsonl"
    proc = subprocess.Popen([*CLI, *ARGS, "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(delay)
    subprocess.run(["pkill", "-x", "dockerd"], check=False)
    proc.wait(timeout=600)
    while subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode == 0:
        time.sleep(0.5)
    subprocess.run(["bash", str(ROOT / "scripts" / "ensure-docker.sh")], check=True,
                   capture_output=True)  # fmt: skip
    saved = lines(out)
    cleaned = cli("cleanup")
    resumed = cli(*ARGS, "-o", str(out), "--resume", "--retry-failed")
    got = runs(out)
    continued, kept = resumed_steps(out)
    return {
        "fault": "dockerd stopped and restarted", "delay_s": round(delay, 2),
        "killed_mid_run": True, "saved_before_kill": saved, "containers_at_kill": "-",
        "left_after_cleanup": asyncio.run(containers_of(proc.pid)) + (cleaned.returncode != 0),
        "resume_exit": resumed.returncode, "keys": len(got),
        "differing": sum(got.get(k) != v for k, v in reference.items()),
        "continued": continued, "steps_kept": kept,
    }  # fmt: skip


def disk_full(work: Path, reference: dict[Any, Any]) -> dict[str, Any]:
    """The results file on a 64 KiB tmpfs: the run stops; remounted larger, it resumes."""
    mount = work / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        out = mount / "full.jsonl"
        first = cli(*ARGS, "-o", str(out))
        saved = lines(out)
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        cleaned = cli("cleanup")
        resumed = cli(*ARGS, "-o", str(out), "--resume")
        got = runs(out)
        continued, kept = resumed_steps(out)
        return {
            "fault": f"results disk full (exit {first.returncode}: "
            f"{(first.stderr.strip().splitlines() or [''])[-1].replace(str(mount), '<dir>')})",
            "delay_s": "-", "killed_mid_run": first.returncode != 0, "saved_before_kill": saved,
            "containers_at_kill": "-", "left_after_cleanup": int(cleaned.returncode != 0),
            "resume_exit": resumed.returncode, "keys": len(got),
            "differing": sum(got.get(k) != v for k, v in reference.items()),
            "continued": continued, "steps_kept": kept,
        }  # fmt: skip
    finally:
        subprocess.run(["umount", str(mount)], check=False)


RL = (sys.executable, str(ROOT / "examples" / "train_agent_rl.py"), "--quick", "--estimator",
      "grpo", "--steps", "4")  # fmt: skip
_STEP_LINE = re.compile(r"^\[grpo seed 0\] step +(\d+) ")


def rl_kill(work: Path, after: int) -> dict[str, Any]:
    """SIGKILL the RL example (``--resume DIR``) once its step ``after`` is logged, clean up,
    run it again: it must go on from the next step, log every step once, and leave nothing."""
    ckpt = work / f"rl-{after}"
    proc = subprocess.Popen([*RL, "--resume", str(ckpt)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    first: list[int] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := _STEP_LINE.match(line):
            first.append(int(m[1]))
            if first[-1] == after:
                break
    time.sleep(1.0)  # into the next step: its rollouts in flight, containers live
    live = asyncio.run(containers_of(proc.pid))
    proc.kill()
    proc.wait()
    cleaned = cli("cleanup")
    again = subprocess.run([*RL, "--resume", str(ckpt)], capture_output=True, text=True,
                           check=False, timeout=900)  # fmt: skip
    second = [int(m[1]) for line in again.stdout.splitlines() if (m := _STEP_LINE.match(line))]
    return {
        "killed_after_step": after, "containers_at_kill": live,
        "left_after_cleanup": asyncio.run(containers_of(proc.pid)) + (cleaned.returncode != 0),
        "steps_before": first, "steps_after": second, "exit": again.returncode,
        "resumed_line": any("resumed after step" in ln for ln in again.stdout.splitlines()),
        "left_at_end": "containers left: 0" in again.stdout,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="draws the kill points")
    parser.add_argument("--out", type=Path, default=None, help="a Markdown table")
    parser.add_argument("--faults", action="store_true", help="also restart dockerd, fill the disk")
    parser.add_argument("--rl-kills", type=int, default=0, help="SIGKILLs of the RL example")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        began = time.perf_counter()
        done = cli(*ARGS, "-o", str(work / "reference.jsonl"))
        wall = time.perf_counter() - began
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        reference = runs(work / "reference.jsonl")
        rows = []
        for i in range(args.kills):
            row = one_kill(work, rng.uniform(0.5, wall), reference)
            rows.append(row)
            print(i + 1, row, flush=True)
        if args.faults:
            for row in (engine_restart(work, rng.uniform(1.0, wall), reference),
                        disk_full(work, reference)):  # fmt: skip
                rows.append(row)
                print(row, flush=True)
        rl_rows = [rl_kill(work, rng.randrange(3)) for _ in range(args.rl_kills)]
        for row in rl_rows:
            print(row, flush=True)
    rl_ok = all(r["steps_before"] + r["steps_after"] == list(range(4)) and r["exit"] == 0
                and r["resumed_line"] and r["left_at_end"] and r["left_after_cleanup"] == 0
                for r in rl_rows)  # fmt: skip
    ok = rl_ok and all(r["differing"] == 0 and r["keys"] == len(reference) and r["resume_exit"] == 0
             and r["left_after_cleanup"] == 0 for r in rows)  # fmt: skip
    table = [
        "| fault | at (s) | stopped mid-run | saved before | containers at kill | left after "
        "cleanup | resume exit | keys | continued mid-episode (steps kept) | differing from "
        "the uninterrupted run |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {r['fault']} | {r['delay_s']} | {r['killed_mid_run']} | "
            f"{r['saved_before_kill']} | {r['containers_at_kill']} | "
            f"{r['left_after_cleanup']} | {r['resume_exit']} | {r['keys']}/{len(reference)} | "
            f"{r['continued']} ({r['steps_kept']}) | {r['differing']} |"
            for r in rows
        ),
    ]
    rl_table = [
        "",
        "## SIGKILL of the RL loop",
        "",
        f"`examples/train_agent_rl.py {' '.join(RL[2:])} --resume DIR`, killed with SIGKILL "
        "about a second into the step after a random logged one (its rollouts in flight), "
        "then `llenvs-async cleanup` and the same command again.",
        "",
        "| killed after step | containers at kill | left after cleanup | steps logged before "
        "| steps logged after | resumed | exit | containers left at the end |",
        "| ---: | ---: | ---: | --- | --- | --- | ---: | --- |",
        *(
            f"| {r['killed_after_step']} | {r['containers_at_kill']} | "
            f"{r['left_after_cleanup']} | {r['steps_before']} | {r['steps_after']} | "
            f"{r['resumed_line']} | {r['exit']} | {0 if r['left_at_end'] else 'some'} |"
            for r in rl_rows
        ),
    ] if rl_rows else []  # fmt: skip
    text = "\n".join(
        [
            "# Faults and resume of a container run",
            "",
            f"`llenvs-async {' '.join(ARGS[:1])} examples/tasks {' '.join(ARGS[2:])}`, killed "
            f"with SIGKILL at {args.kills} points drawn uniformly over the uninterrupted run's "
            f"{wall:.1f} s (seed {args.seed}), then `llenvs-async cleanup` and `--resume`"
            f"{'; then the faults below' if args.faults else ''}. Every (task, rollout) "
            "compared with the uninterrupted run (actions and return). A rollout in flight at "
            "the fault continues from its last journaled step (`continued mid-episode`: how "
            "many did, and the steps they did not redo).",
            "",
            *table,
            *rl_table,
            "",
            f"Result: {'every resumed run equals the uninterrupted one' if ok else 'MISMATCH'}.",
            "",
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
