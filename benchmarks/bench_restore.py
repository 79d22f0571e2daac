"""Restoring B containers to a saved state by replaying its L-action prefix: the runner's
concurrent multi-instance path vs one replay, a sequential loop and the seed's design.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any

from llenvs_async import (
    Action,
    Environment,
    GenerationRequest,
    ScriptedBackend,
    State,
    Trajectory,
    TrajectoryRunner,
    replay_restore,
)
from llenvs_async.docker import (
    BUSYBOX_IMAGE,
    ContainerSpec,
    DockerEngine,
    DockerEnvironment,
    ensure_busybox_image,
)
from llenvs_async.docker.pool import WarmPool

from ._common import Result, Target, bench_main, fmt_spread, make_result, plot, spread, table
from .baselines import (
    LoopThread,
    SyncEnvironment,
    SyncLatencyBackend,
    SyncTrajectoryRunner,
    ThreadedEnv,
    sync_replay_restore,
)

__all__ = ["main", "run"]

FULL: dict[str, Any] = {"instances": 16, "prefix_lengths": [0, 5, 20, 50], "repeats": 3}
QUICK: dict[str, Any] = {"instances": 2, "prefix_lengths": [0, 2], "repeats": 1}
RATIO_LIMIT = 1.5
MODES = ("one", "concurrent", "warm", "sequential", "seed")


def command(i: int) -> str:
    """The i-th prefix action: a small file change plus a forked process, like agent work."""
    return f"echo {i} >> /tmp/replay.log && wc -l < /tmp/replay.log"


def submit(request: GenerationRequest) -> str:
    return "SUBMIT"


class TimedDockerEnv(DockerEnvironment):
    """DockerEnvironment on the busybox image that notes when its container became ready."""

    def __init__(self, engine: DockerEngine, pool: WarmPool | None = None) -> None:
        super().__init__(image=BUSYBOX_IMAGE, engine=None if pool else engine, pool=pool)
        self.created_at = 0.0

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        state = await super()._reset(task, seed=seed)
        self.created_at = time.perf_counter()
        return state


@dataclass(frozen=True, slots=True)
class Timing:
    """One restore of B instances, in seconds from its start: all restored (``total``),
    all containers ready (``creation``), the slowest command replay, and our process's CPU.
    """

    total: float
    creation: float
    replay: float
    cpu: float


@dataclass(slots=True)
class Clock:
    """Collects when each instance of one restore became ready and finished its replay."""

    started: float = field(default_factory=time.perf_counter)
    cpu_started: float = field(default_factory=time.process_time)
    marks: list[tuple[float, float, float]] = field(default_factory=list)

    def restored(self, env: TimedDockerEnv) -> None:
        self.marks.append((env.created_at, time.perf_counter(), time.process_time()))

    def timing(self, size: int) -> Timing:
        assert len(self.marks) == size, f"{len(self.marks)} of {size} instances restored"
        return Timing(
            total=max(done for _, done, _ in self.marks) - self.started,
            creation=max(ready for ready, _, _ in self.marks) - self.started,
            replay=max(done - ready for ready, done, _ in self.marks),
            cpu=max(cpu for _, _, cpu in self.marks) - self.cpu_started,
        )


async def saved_state(engine: DockerEngine, length: int) -> State:
    """A state ``length`` commands into an episode, recorded on a real container."""
    async with TimedDockerEnv(engine) as env:
        state = await env.reset(0)
        for i in range(length):
            state = (await env.step(state, Action(text=command(i)))).next_state
    return state


def _check(trajs: Sequence[Trajectory], size: int) -> None:
    failed = [t.error for t in trajs if t.error is not None]
    assert len(trajs) == size and not failed, f"restore benchmark rollouts failed: {failed[:1]}"


async def restore_with_runner(
    engine: DockerEngine, state: State, size: int, pool: WarmPool | None = None
) -> Timing:
    """The framework: ``run_batch_from_states`` restores ``size`` fresh instances concurrently
    (from a filled ``pool`` of started containers, if given: filling is not timed)."""

    async def restore(env: Environment, target: State) -> State:
        result = await replay_restore(env, target)
        assert isinstance(env, TimedDockerEnv)
        clock.restored(env)
        return result

    async def factory() -> TimedDockerEnv:
        return TimedDockerEnv(engine, pool)

    if pool is not None:
        await pool.fill(ContainerSpec(image=BUSYBOX_IMAGE))
    async with TimedDockerEnv(engine) as primary:
        runner = TrajectoryRunner(
            environment=primary,
            backend=ScriptedBackend(submit),
            env_factory=factory,
            restore_fn=restore,
        )
        clock = Clock()
        trajs = await runner.run_batch_from_states([state] * size, batch_size=size, max_steps=1)
    _check(trajs, size)
    return clock.timing(size)


async def restore_sequentially(engine: DockerEngine, state: State, size: int) -> Timing:
    """``size`` instances restored one after another (then all are closed)."""
    envs: list[TimedDockerEnv] = []
    clock = Clock()
    try:
        for _ in range(size):
            envs.append(TimedDockerEnv(engine))
            await replay_restore(envs[-1], state)
            clock.restored(envs[-1])
    finally:
        await asyncio.gather(*(env.aclose() for env in envs))
    return clock.timing(size)


def restore_like_the_seed(
    loop: LoopThread, engine: DockerEngine, state: State, size: int
) -> Timing:
    """The seed's design: factory calls in turn, restores in a default ThreadPoolExecutor."""

    def restore(env: SyncEnvironment, target: State) -> State:
        result = sync_replay_restore(env, target)
        assert isinstance(env, ThreadedEnv) and isinstance(env.env, TimedDockerEnv)
        clock.restored(env.env)
        return result

    runner = SyncTrajectoryRunner(
        SyncLatencyBackend(0.0, submit),
        lambda: ThreadedEnv(TimedDockerEnv(engine), loop),
        restore_fn=restore,
        max_steps=1,
    )
    clock = Clock()
    _check(runner.run_batch_from_states([state] * size), size)
    return clock.timing(size)


async def _connected() -> DockerEngine:
    return await DockerEngine().connect()


def measure(p: dict[str, Any]) -> tuple[dict[str, dict[int, list[Timing]]], int]:
    """Every mode at every prefix length, repeats interleaved; also the leftover count."""
    size = p["instances"]
    times: dict[str, dict[int, list[Timing]]] = {mode: {} for mode in MODES}
    with LoopThread() as loop:
        engine = loop.call(_connected())
        pool = WarmPool(engine, size)
        try:
            loop.call(ensure_busybox_image(engine))
            modes: dict[str, Callable[[State], Timing]] = {
                "one": lambda s: loop.call(restore_with_runner(engine, s, 1)),
                "concurrent": lambda s: loop.call(restore_with_runner(engine, s, size)),
                "warm": lambda s: loop.call(restore_with_runner(engine, s, size, pool)),
                "sequential": lambda s: loop.call(restore_sequentially(engine, s, size)),
                "seed": lambda s: restore_like_the_seed(loop, engine, s, size),
            }
            for length in p["prefix_lengths"]:
                state = loop.call(saved_state(engine, length))
                for _ in range(p["repeats"]):
                    for mode, fn in modes.items():
                        times[mode].setdefault(length, []).append(fn(state))
        finally:
            loop.call(pool.aclose())
            leftover = loop.call(engine.own_containers())
            for item in leftover:
                loop.call(engine.remove_container(item["Id"]))
            loop.call(engine.aclose())
    return times, len(leftover)


def _median(timings: Sequence[Timing], what: str) -> float:
    return float(median(getattr(t, what) for t in timings))


def run(quick: bool = False) -> Result:
    """Measure every mode; judge concurrent restore against one replay at each L."""
    p = QUICK if quick else FULL
    times, leftover = measure(p)
    lengths: list[int] = p["prefix_lengths"]
    b = p["instances"]
    rows = []
    targets = []
    for length in lengths:
        one, conc = times["one"][length], times["concurrent"][length]
        warm = times["warm"][length]
        seq, seed = times["sequential"][length], times["seed"][length]
        warm_ratio = _median(warm, "total") / _median(one, "total")
        c = spread([t.total for t in conc])
        total_ratio = c["median"] / _median(one, "total")
        replay_ratio = _median(conc, "replay") / _median(one, "replay")
        rows.append(
            [
                length,
                _median(one, "total"),
                fmt_spread(c),
                total_ratio,
                _median(conc, "creation"),
                _median(one, "replay"),
                _median(conc, "replay"),
                replay_ratio if length else "-",
                _median(warm, "total"),
                warm_ratio,
                _median(conc, "cpu") / c["median"],
                _median(seq, "total"),
                _median(seq, "total") / c["median"],
                _median(seed, "total"),
                _median(seed, "total") / c["median"],
            ]
        )
        if length > 0:
            targets += [
                Target(f"restore {b} vs one, L={length}", total_ratio, RATIO_LIMIT, "<=", "x",
                       "median concurrent / median one, container creation included"),
                Target(f"replay phase {b} vs one, L={length}", replay_ratio, RATIO_LIMIT, "<=",
                       "x", "slowest replay after its container was ready / one"),
                Target(f"restore {b} from a warm pool of {b} vs one, L={length}", warm_ratio,
                       RATIO_LIMIT, "<=", "x", "median warm / median one (one is cold)"),
            ]  # fmt: skip
    first = lengths[0]
    floor = _median(times["concurrent"][first], "total") / _median(times["one"][first], "total")
    cpu = median(_median(ts, "cpu") / _median(ts, "total") for ts in times["concurrent"].values())
    return make_result(
        "restore",
        params={**p, "image": BUSYBOX_IMAGE, "command": command(0), "leftover": leftover},
        targets=targets,
        tables=[
            table(
                f"Restore B={b} containers from a prefix of L actions, seconds",
                [
                    "L",
                    "one: total",
                    "concurrent: total (min-max)",
                    "concurrent / one",
                    "concurrent: all containers ready",
                    "one: replay",
                    "concurrent: slowest replay",
                    "replay concurrent / one",
                    f"warm pool of {b}: total",
                    "warm / one",
                    "our CPU / wall",
                    "sequential",
                    "sequential / concurrent",
                    "seed",
                    "seed / concurrent",
                ],
                rows,
            )
        ],
        plots=[
            plot(
                "restore_time.png",
                f"Restore of {b} containers vs prefix length",
                "L (actions replayed)",
                "seconds until all restored",
                {m: [(n, _median(times[m][n], "total")) for n in lengths] for m in MODES},
                logy=True,
            )
        ],
        notes=[
            "A restore is DockerEnvironment.reset (create + start a container, open its "
            "persistent shell) then replaying L commands, timed until the last instance is "
            "restored. 'one' and 'concurrent' go through TrajectoryRunner.run_batch_from_states.",
            "L=0 is container creation alone: the Docker engine's floor on this machine.",
            f"'warm': the same restore with a WarmPool of {b} started containers (shell open), "
            "filled before the clock starts; each take starts a background refill, which runs "
            "during the replays (its cost is in the number). 'one' is a cold restore.",
            "'our CPU / wall': CPU time of the benchmark process over the concurrent restore; "
            "the rest of the wall time is the Docker engine, the containers and other load.",
            "The seed side runs the same DockerEnvironment through a blocking facade on an "
            "event-loop thread: factory calls in turn, restores in a default ThreadPoolExecutor.",
            f"Containers left behind after the run: {leftover}.",
            f"Creating {b} containers at once (L={first}) already takes {floor:.1f}x one: "
            f"the Docker engine's floor on {os.cpu_count()} cores, while this process used "
            f"{cpu:.0%} of the wall time (median over L of 'our CPU / wall').",
        ],
        data={m: {str(n): [asdict(t) for t in ts] for n, ts in times[m].items()} for m in MODES},
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main()
