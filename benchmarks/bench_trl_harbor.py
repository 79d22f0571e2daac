"""TRL ``environment_factory`` over Harbor tasks: ours vs the path of TRL's own Harbor env.

Same tasks (``examples/tasks``, each task's solution commands, then the verifier), same
machine, one run. Ours: ``HarborToolEnvironment`` as TRL's tool loop calls it (``reset``,
``bash`` per command from a plain thread, ``submit``, ``get_reward``): one persistent shell
per container behind the loop-thread bridge. Theirs: TRL's ``trl.experimental.harbor``
``HarborEnv`` cannot run here (Harbor needs Python >= 3.12; its Docker environment shells
out to ``docker compose``, which this engine lacks), so its per-command path is measured on
the same container: a call submitted to a loop thread (``run_coroutine_threadsafe``) that
runs one ``docker exec -w WORKDIR CONTAINER bash -c COMMAND`` subprocess (Harbor runs
``docker compose exec main bash -c``: compose adds its own start-up on top), output cut at
8 k. Run: ``python -m benchmarks.bench_trl_harbor``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llenvs_async.adapters.harbor import load_task
from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL
from llenvs_async.docker import OWNER_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.integrations.trl_env import TRLHarborEnvironments

from ._common import Result, Target, bench_main, make_result, table

__all__ = ["main", "run"]

TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks"
FULL: dict[str, Any] = {"tasks": None, "repeats": 3}
QUICK: dict[str, Any] = {"tasks": ["csv-totals"], "repeats": 1}
SPEEDUP_TARGET = 5.0  # their per-command p50 over ours


async def _docker_exec(container: str, workdir: str, command: str) -> str:
    """Their per-command path: one ``docker exec`` subprocess, output cut at 8 k."""
    proc = await asyncio.create_subprocess_exec(
        "docker", "exec", "-w", workdir, container, "bash", "-c", command,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    return text[:8000] + "\n... [truncated]" if len(text) > 8000 else text


async def _task_container() -> str:
    async with DockerEngine() as engine:
        found = await engine.list_containers(
            {OWNER_LABEL: engine.labels[OWNER_LABEL], TASK_IMAGE_LABEL: None}
        )
    if len(found) != 1:
        raise RuntimeError(f"expected one task container of ours, found {len(found)}")
    return str(found[0]["Id"])


def _episode(
    environments: TRLHarborEnvironments,
    theirs: asyncio.AbstractEventLoop,
    task: str,
    commands: Sequence[str],
    workdir: str,
) -> dict[str, Any]:
    """One episode ours, then the same commands their way in the same container."""
    env = environments()
    started = time.perf_counter()
    env.reset(task=task)
    reset_s = time.perf_counter() - started
    ours: list[float] = []
    for command in commands:
        t0 = time.perf_counter()
        env.bash(command)
        ours.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    env.submit()
    reward = env.get_reward()
    verify_s = time.perf_counter() - t0
    episode_s = time.perf_counter() - started
    container = asyncio.run(_task_container())
    their: list[float] = []
    for command in commands:
        t0 = time.perf_counter()
        asyncio.run_coroutine_threadsafe(_docker_exec(container, workdir, command), theirs).result()
        their.append(time.perf_counter() - t0)
    env.reset(task=task)  # drop the container before the next episode
    del env
    return {
        "task": task, "reward": reward, "reset_s": reset_s, "verify_s": verify_s,
        "episode_s": episode_s, "ours_s": ours, "theirs_s": their,
    }  # fmt: skip


def _p(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(quick: bool = False) -> Result:
    params = dict(QUICK if quick else FULL)
    names = params["tasks"] or sorted(
        p.name for p in TASKS.iterdir() if (p / "solution" / "solve.sh").is_file()
    )
    loop = asyncio.new_event_loop()  # their env's loop thread
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    episodes = []
    try:
        with TRLHarborEnvironments(TASKS, max_steps=100) as environments:
            for name in names:
                task = load_task(TASKS / name)
                commands = task.solution_commands()
                workdir = task.config.environment.workdir or "/"
                for _ in range(params["repeats"]):
                    episodes.append(_episode(environments, loop, name, commands, workdir))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    rows = []
    for name in names:
        mine = [e for e in episodes if e["task"] == name]
        ours = [s for e in mine for s in e["ours_s"]]
        theirs = [s for e in mine for s in e["theirs_s"]]
        rows.append([
            name, len(mine[0]["ours_s"]), f"{statistics.median(e['reward'] for e in mine):.2f}",
            f"{_p(ours, 0.5) * 1e3:.1f}", f"{_p(theirs, 0.5) * 1e3:.1f}",
            f"{statistics.median(sum(e['ours_s']) for e in mine) * 1e3:.0f}",
            f"{statistics.median(sum(e['theirs_s']) for e in mine) * 1e3:.0f}",
            f"{statistics.median(e['reset_s'] for e in mine):.2f}",
            f"{statistics.median(e['episode_s'] for e in mine):.2f}",
        ])  # fmt: skip
    ours_all = [s for e in episodes for s in e["ours_s"]]
    theirs_all = [s for e in episodes for s in e["theirs_s"]]
    ratio = _p(theirs_all, 0.5) / _p(ours_all, 0.5)
    return make_result(
        "bench_trl_harbor",
        params={**params, "tasks": names},
        tables=[
            table(
                "Per task (medians over repeats; ms unless s)",
                [
                    "task",
                    "commands",
                    "reward",
                    "ours p50/cmd",
                    "theirs p50/cmd",
                    "ours: all commands ms",
                    "theirs: all commands ms",
                    "reset s",
                    "ours episode s",
                ],
                rows,
            ),
            table(
                "All commands (ms)",
                ["path", "p50", "p95", "n"],
                [
                    [
                        "ours: bash tool, persistent shell",
                        f"{_p(ours_all, 0.5) * 1e3:.2f}",
                        f"{_p(ours_all, 0.95) * 1e3:.2f}",
                        len(ours_all),
                    ],
                    [
                        "theirs: docker exec per call",
                        f"{_p(theirs_all, 0.5) * 1e3:.2f}",
                        f"{_p(theirs_all, 0.95) * 1e3:.2f}",
                        len(theirs_all),
                    ],
                ],
            ),
        ],
        targets=[
            Target(
                "their per-command p50 / ours",
                ratio,
                SPEEDUP_TARGET,
                ">=",
                "x",
                "same commands, same containers, same run",
            ),
        ],
        notes=[
            "ours episode = reset (container start) + commands + submit (verifier) through "
            "the TRL-facing methods, from a plain thread as TRL's tool loop calls them",
            "theirs = the per-command path of trl.experimental.harbor.HarborEnv (see the "
            "module docs): it cannot run here, so container start and verifier are not "
            "compared; `docker compose exec` would add compose's own start-up per call",
            "their shell is not stateful between calls (a `cd` is lost); ours is",
        ],
        data={"episodes": episodes},
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
