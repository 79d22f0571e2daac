"""Snapshot-fork vs concurrent replay: B Harbor instances restored to one state of L actions.

Concurrent replay (``harbor_restore``) starts B containers and replays the prefix in
each; snapshot-fork (``SnapshotRestore``) replays it once, commits that container and
starts the other B-1 from the snapshot. On gVisor (``runtime="gvisor"``) the same replay
runs in sandboxes, and the gVisor fork (``SnapshotRestore(processes=True)``) replays once,
checkpoints the sandbox and restores all B from the checkpoint. All go through
``TrajectoryRunner`` (``run_batch_from_states``); a restore's time runs until the last
instance is restored. Also: each gVisor fork's own restore time, and one shell command's
cost under runc vs gVisor. Run: ``python -m benchmarks.bench_snapshot [--quick]``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from llenvs_async import (
    Action,
    Environment,
    GenerationRequest,
    ScriptedBackend,
    State,
    TrajectoryRunner,
)
from llenvs_async._ownership import current_owner
from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    SnapshotRestore,
    harbor_restore,
)
from llenvs_async.docker import Container, ContainerSpec, DockerEngine, ensure_base_image
from llenvs_async.docker.snapshots import list_snapshot_images, remove_image
from llenvs_async.policies import fenced
from llenvs_async.sandbox import Sandbox, find_runsc, remove_own_sandboxes_sync

from ._common import Result, Target, bench_main, make_result, plot, spread, table

__all__ = ["main", "run"]

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks"
# Prefix actions ({i}: the action's number): bench_restore's shell action (~2 ms, a forked
# `wc`), and a Python one-liner doing some work (tens of ms), closer to an agent's scripts.
WORKLOADS = {
    "shell": "echo {i} >> /tmp/replay.log && wc -l < /tmp/replay.log",
    "python": "python3 -c 'import hashlib, json; print({i}, hashlib.sha256(json.dumps("
    "list(range(200000))).encode()).hexdigest()[:8])' >> /tmp/replay.log",
}
FULL: dict[str, Any] = {
    "instances": 16,
    "prefix_lengths": {"shell": [5, 20, 50], "python": [20]},
    "repeats": 3,
    "task": "csv-totals",
    "workloads": WORKLOADS,
}
QUICK: dict[str, Any] = {
    **FULL,
    "instances": 3,
    "prefix_lengths": {"shell": [2], "python": [2]},
    "repeats": 1,
}
TARGET_LENGTH = 20
RATIO_LIMIT = 0.3
MODES = ("replay", "snapshot", "gvisor replay", "gvisor fork")
FIRST = "snapshot, first"
GV_FIRST = "gvisor fork, first"
SHELL_COMMANDS = 200
COLUMNS = (
    "actions",
    "ms per action",
    "L",
    "concurrent replay",
    "snapshot-fork",
    "snapshot-fork: first (replay + commit)",
    "ratio",
    "gVisor replay",
    "gVisor fork",
    "gVisor fork: first (replay + checkpoint + restore)",
    "gVisor fork / replay",
)
Restore = Callable[[Environment, State], Awaitable[State]]
Times = dict[str, dict[str, dict[int, list[float]]]]  # workload -> mode -> L -> seconds
# mode "snapshot, first": until the first instance is restored (the replay and the commit)


def noop(request: GenerationRequest) -> str:
    return fenced("true")


async def saved_state(adapter: HarborAdapter, task: str, actions: Sequence[str]) -> State:
    """The state after ``actions`` in an episode of ``task``, recorded on a real container."""
    async with await adapter.get_environment(TASKS, max_steps=None) as env:
        state = await env.reset(task)
        for action in actions:
            state = (await env.step(state, Action(text=action))).next_state
    return state


async def restore_batch(
    adapter: HarborAdapter, state: State, size: int, mode: str, fork_s: list[float]
) -> tuple[float, float]:
    """Seconds until the first and until all ``size`` instances are restored to ``state``
    through the runner; a gVisor fork's per-instance restore seconds go to ``fork_s``."""
    done: list[float] = []

    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(TASKS, max_steps=None)

    async with SnapshotRestore(processes=mode == "gvisor fork") as snapshots:
        inner: Restore = snapshots if mode in ("snapshot", "gvisor fork") else harbor_restore

        async def timed(env: Environment, target: State) -> State:
            restored = await inner(env, target)
            done.append(time.perf_counter())
            record = restored.info.get("restore", {})
            if record.get("method") == "checkpoint":
                fork_s.append(record["resume_sec"])
            return restored

        async with await env_factory() as primary:
            runner = TrajectoryRunner(
                environment=primary,
                backend=ScriptedBackend(noop),
                env_factory=env_factory,
                restore_fn=timed,
            )
            started = time.perf_counter()
            trajs = await runner.run_batch_from_states([state] * size, size, max_steps=1)
    failed = [t.error for t in trajs if t.error is not None]
    assert len(done) == size and not failed, f"snapshot benchmark rollouts failed: {failed[:1]}"
    if mode in ("snapshot", "gvisor fork"):
        forked = "snapshot" if mode == "snapshot" else "checkpoint"
        methods = sorted(t.initial_state.info["restore"]["method"] for t in trajs)
        assert methods == sorted(["replay"] + [forked] * (size - 1)), methods
    return min(done) - started, max(done) - started


async def shell_cost(engine: DockerEngine, image: str) -> dict[str, float]:
    """Median seconds of one trivial command (``:``) through the persistent shell, per runtime."""
    costs: dict[str, float] = {}
    spec = ContainerSpec(image=image)
    for runtime in ("runc", "gvisor"):
        host = await (Container.create(engine, spec) if runtime == "runc"
                      else Sandbox.create(engine, spec))  # fmt: skip
        async with host:
            shell = await host.shell()
            samples = []
            for _ in range(SHELL_COMMANDS):
                began = time.perf_counter()
                await shell.run(":")
                samples.append(time.perf_counter() - began)
        costs[runtime] = spread(samples)["median"]
    return costs


async def leftovers(engine: DockerEngine) -> int:
    """Remove (and count) this process's containers and snapshot images still present."""
    containers = await engine.own_containers()
    for item in containers:
        await engine.remove_container(item["Id"])
    images = await list_snapshot_images(engine, owner=current_owner().label)
    for item in images:
        await remove_image(engine, item["Id"])
    sandboxes = remove_own_sandboxes_sync(find_runsc())
    return len(containers) + len(images) + len(sandboxes)


async def measure(
    p: dict[str, Any],
) -> tuple[Times, dict[str, float], int, list[float], dict[str, float]]:
    """Every mode for every workload and prefix length, repeats interleaved; also each
    workload's action time (s, its last action in a live episode), the leftover count, the
    gVisor forks' own restore times and the shell's per-command cost per runtime."""
    times: Times = {w: {m: {} for m in (*MODES, FIRST, GV_FIRST)} for w in p["prefix_lengths"]}
    action_s: dict[str, float] = {}
    fork_s: list[float] = []
    async with DockerEngine() as engine:
        try:
            await ensure_base_image(engine)
            with tempfile.TemporaryDirectory() as cache:
                runc = HarborAdapter(cache_dir=cache, engine=engine)
                gvisor = HarborAdapter(cache_dir=cache, engine=engine, runtime="gvisor")
                await saved_state(gvisor, p["task"], ())  # builds the image, exports its rootfs
                image = await runc.runtime.images.ensure(
                    engine, (await runc.get_dataset(TASKS)).resolve(p["task"])[1]
                )
                shell_s = await shell_cost(engine, image)
                for workload, lengths in p["prefix_lengths"].items():
                    for length in lengths:
                        actions = [WORKLOADS[workload].format(i=i) for i in range(length)]
                        state = await saved_state(runc, p["task"], actions)
                        action_s[workload] = state.info["duration_sec"]
                        for _ in range(p["repeats"]):
                            for mode in MODES:
                                adapter = gvisor if mode.startswith("gvisor") else runc
                                first, last = await restore_batch(
                                    adapter, state, p["instances"], mode, fork_s
                                )
                                times[workload][mode].setdefault(length, []).append(last)
                                head = {"snapshot": FIRST, "gvisor fork": GV_FIRST}.get(mode)
                                if head is not None:
                                    times[workload][head].setdefault(length, []).append(first)
        finally:
            left = await leftovers(engine)
    return times, action_s, left, fork_s, shell_s


def _cell(samples: Sequence[float]) -> str:
    s = spread(samples)
    return f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"


def run(quick: bool = False) -> Result:
    """Measure both modes; judge snapshot-fork against concurrent replay at L=20."""
    p = dict(QUICK if quick else FULL)
    times, action_s, left, fork_s, shell_s = asyncio.run(measure(p))
    b = p["instances"]
    rows = []
    targets = []
    for workload, by_mode in times.items():
        for length, replay in by_mode["replay"].items():
            snap = by_mode["snapshot"][length]
            gv_fork = by_mode["gvisor fork"][length]
            ratio = spread(snap)["median"] / spread(replay)["median"]
            gv_ratio = spread(gv_fork)["median"] / spread(replay)["median"]
            ms = action_s[workload] * 1000
            cells = [_cell(replay), _cell(snap), _cell(by_mode[FIRST][length]), f"{ratio:.2f}",
                     _cell(by_mode["gvisor replay"][length]), _cell(gv_fork),
                     _cell(by_mode[GV_FIRST][length]), f"{gv_ratio:.2f}"]  # fmt: skip
            rows.append([workload, f"{ms:.1f}", length, *cells])
            if length == TARGET_LENGTH or quick:
                targets.append(
                    Target(f"snapshot-fork / concurrent replay, {workload} actions, B={b}, "
                           f"L={length}", ratio, RATIO_LIMIT, "<=", "x",
                           "median seconds until all B instances are restored"),
                )  # fmt: skip
                targets.append(
                    Target(f"gVisor fork / concurrent replay (runc), {workload} actions, B={b}, "
                           f"L={length}", gv_ratio, RATIO_LIMIT, "<=", "x",
                           "median seconds until all B instances are restored"),
                )  # fmt: skip
    fork = spread(fork_s)
    overhead = [
        ["runc (docker exec shell)", f"{shell_s['runc'] * 1000:.2f}", "1.0"],
        ["gVisor (FIFO relay, ptrace)", f"{shell_s['gvisor'] * 1000:.2f}",
         f"{shell_s['gvisor'] / shell_s['runc']:.1f}"],
    ]  # fmt: skip
    return make_result(
        "bench_snapshot",
        params={**p, "leftover": left},
        targets=targets,
        tables=[
            table(
                f"Restore B={b} instances of one state after L actions: seconds, median (min-max)",
                COLUMNS,
                rows,
            ),
            table(
                f"One command (`:`) through the persistent shell, median of {SHELL_COMMANDS}",
                ("runtime", "ms per command", "x runc"),
                overhead,
            ),
            table(
                "One gVisor fork's resume (runsc restore, relay, adopted shell), B-1 at once",
                ("forks", "median s", "min s", "max s"),
                [
                    [
                        len(fork_s),
                        f"{fork['median']:.3f}",
                        f"{fork['min']:.3f}",
                        f"{fork['max']:.3f}",
                    ]
                ],
            ),
        ],
        plots=[
            plot(
                "bench_snapshot.png",
                f"Restore of {b} Harbor instances from one state ({', '.join(times)} actions)",
                "L (actions in the prefix)",
                "seconds until all restored",
                {
                    f"{w}: {m}": [(n, spread(ts)["median"]) for n, ts in times[w][m].items()]
                    for w in times
                    for m in MODES
                },
            )
        ],
        notes=[
            f"Task {p['task']} (examples/tasks, Debian base image). Actions: "
            + "; ".join(f"{w}: `{WORKLOADS[w]}`" for w in times)
            + ". 'ms per action': the last action's time in the live episode.",
            "concurrent replay: B containers started and the prefix replayed in each "
            "(harbor_restore). snapshot-fork: one replay + `docker commit`, then B-1 containers "
            "started from the snapshot and their cwd, umask and exports re-applied. Each repeat "
            "uses a new SnapshotRestore (replay, commit, fork); removing the snapshot at "
            "teardown is not counted.",
            "'first (replay + commit)': until the instance that replayed and committed is "
            "restored; the other B-1 then start from the snapshot. "
            "ratio: median snapshot-fork / median concurrent replay. Both pay B container "
            "starts (the Docker engine's floor on this machine); snapshot-fork saves the B-1 "
            "replays, so it wins when replaying the prefix costs more than starting a container.",
            "gVisor replay: harbor_restore in B gVisor sandboxes (runsc, ptrace platform, "
            "--overlay2=root:memory). gVisor fork: SnapshotRestore(processes=True): one replay, "
            "`runsc checkpoint` (the sandbox stops), then all B, the replayed one too, "
            "restored from the checkpoint with processes and the whole shell state; 'first' "
            "is until the replayed instance runs again from its checkpoint. 'gVisor fork / "
            "replay' compares with the runc replay (the default restore). A fork's resume: "
            "runsc restore to the restored shell adopted (info['restore']['resume_sec']), "
            "with B-1 resumes sharing 2 cores.",
            f"Containers, snapshot images and sandboxes left behind after the run: {left}.",
        ],
        data={
            "seconds": times,
            "action_seconds": action_s,
            "fork_restore_seconds": fork_s,
            "shell_command_seconds": shell_s,
        },
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
