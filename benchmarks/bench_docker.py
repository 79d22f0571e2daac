"""One command through the persistent shell vs one exec per command, on a real engine.

Latency (p50/p95) of a trivial command three ways — the persistent shell, one aiodocker
exec, one ``docker exec`` CLI subprocess — and lockstep throughput (commands/s) with B
containers each running one command per round. Run: ``python -m benchmarks.bench_docker``.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from llenvs_async.docker import (
    BASE_IMAGE,
    Container,
    ContainerSpec,
    DockerEngine,
    ShellSession,
    ensure_base_image,
)

from ._common import Result, Target, bench_main, make_result, plot, table

__all__ = ["main", "run"]

FULL: dict[str, Any] = {
    "image": BASE_IMAGE,
    "command": "cat /etc/hostname",
    "builtin": "echo ok",
    "latency_samples": {"shell": 400, "exec": 40, "cli": 30},
    "batch_sizes": [1, 4, 8, 16, 32],
    "shell_rounds": 40,
    "exec_commands_per_batch": 32,
    "warmup": 5,
}
QUICK: dict[str, Any] = {
    **FULL,
    "latency_samples": {"shell": 50, "exec": 5, "cli": 3},
    "batch_sizes": [1, 4],
    "shell_rounds": 5,
    "exec_commands_per_batch": 4,
    "warmup": 1,
}
OVERHEAD_LIMIT_MS = 1.0
THROUGHPUT_LIMIT = 400.0


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def exec_once(container: Container, argv: Sequence[str]) -> int | None:
    """One command as one exec: create, start, read to the end, inspect for the exit code."""
    execution, stream = await container.open_exec(argv)
    try:
        while await stream.read_out() is not None:
            pass
    finally:
        await stream.close()
    code = (await execution.inspect()).get("ExitCode")
    return code if isinstance(code, int) else None


async def cli_once(container_id: str, argv: Sequence[str]) -> int:
    proc = await asyncio.create_subprocess_exec(
        "docker", "exec", container_id, *argv, stdout=asyncio.subprocess.DEVNULL
    )
    return await proc.wait()


async def timed(samples: int, warmup: int, once: Any) -> list[float]:
    """Latencies in seconds of ``samples`` sequential calls of ``once()`` after a warmup."""
    for _ in range(warmup):
        await once()
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        await once()
        out.append(time.perf_counter() - started)
    return out


async def shell_latency(
    shell: ShellSession, command: str, params: dict[str, Any]
) -> dict[str, float]:
    """Latency of ``command`` through the shell, and our process's CPU time per command."""

    async def once() -> None:
        result = await shell.run(command, timeout=30)
        assert result.exit_code == 0, result

    cpu = time.process_time()
    samples = await timed(params["latency_samples"]["shell"], params["warmup"], once)
    cpu_ms = (time.process_time() - cpu) / (len(samples) + params["warmup"]) * 1e3
    return {**summary(samples), "client_cpu_ms": cpu_ms}


def summary(samples: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(samples, 0.5) * 1e3,
        "p95_ms": percentile(samples, 0.95) * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
        "n": len(samples),
    }


async def lockstep_shell(shells: Sequence[ShellSession], rounds: int, command: str) -> float:
    """Commands/s when every shell runs one command per round, all concurrently."""
    started = time.perf_counter()
    for _ in range(rounds):
        async with asyncio.TaskGroup() as tg:
            for shell in shells:
                tg.create_task(shell.run(command, timeout=60))
    return len(shells) * rounds / (time.perf_counter() - started)


async def lockstep_exec(containers: Sequence[Container], total: int, argv: Sequence[str]) -> float:
    """Commands/s when every container runs one exec per round, all concurrently."""
    rounds = max(1, total // len(containers))
    started = time.perf_counter()
    for _ in range(rounds):
        async with asyncio.TaskGroup() as tg:
            for container in containers:
                tg.create_task(exec_once(container, argv))
    return len(containers) * rounds / (time.perf_counter() - started)


async def measure(params: dict[str, Any]) -> dict[str, Any]:
    argv = params["command"].split()
    async with DockerEngine() as engine:
        engine_version = str((await engine.version()).get("Version", "?"))
        await ensure_base_image(engine)
        spec = ContainerSpec(image=params["image"])
        containers: list[Container] = []
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(Container.create(engine, spec))
                    for _ in range(max(params["batch_sizes"]))
                ]
            containers = [t.result() for t in tasks]
            async with asyncio.TaskGroup() as tg:
                shell_tasks = [tg.create_task(c.shell()) for c in containers]
            shells = [t.result() for t in shell_tasks]
            first = containers[0]
            n = params["latency_samples"]
            latency = {
                "shell, builtin": await shell_latency(shells[0], params["builtin"], params),
                "shell": await shell_latency(shells[0], params["command"], params),
                "exec": summary(
                    await timed(n["exec"], params["warmup"], lambda: exec_once(first, argv))
                ),
            }
            if shutil.which("docker"):
                latency["cli"] = summary(
                    await timed(n["cli"], params["warmup"], lambda: cli_once(first.id, argv))
                )
            throughput = []
            for b in params["batch_sizes"]:
                rounds = params["shell_rounds"]
                row = {
                    "B": b,
                    "shell": await lockstep_shell(shells[:b], rounds, params["command"]),
                    "shell, builtin": await lockstep_shell(shells[:b], rounds, params["builtin"]),
                    "exec": await lockstep_exec(
                        containers[:b], params["exec_commands_per_batch"], argv
                    ),
                }
                throughput.append(row)
        finally:
            async with asyncio.TaskGroup() as tg:
                for container in containers:
                    tg.create_task(container.aclose())
    return {"latency": latency, "throughput": throughput, "engine_version": engine_version}


def run(quick: bool = False) -> Result:
    params = dict(QUICK if quick else FULL)
    data = asyncio.run(measure(params))
    latency, throughput = data["latency"], data["throughput"]
    builtin = latency["shell, builtin"]
    at8 = next((row["shell"] for row in throughput if row["B"] == 8), 0.0)
    targets = [
        Target("shell framework overhead p50", builtin["p50_ms"], OVERHEAD_LIMIT_MS, "<=", "ms",
               "round trip of a shell builtin: an upper bound on the framework's share"),
        Target("lockstep throughput, 8 containers, shell", at8, THROUGHPUT_LIMIT, ">=", "cmd/s"),
    ]  # fmt: skip
    latency_rows = [
        [how, f"{s['p50_ms']:.2f}", f"{s['p95_ms']:.2f}", f"{s['mean_ms']:.2f}", s["n"]]
        for how, s in latency.items()
    ]
    rows = [
        [r["B"], f"{r['shell']:.0f}", f"{r['shell, builtin']:.0f}", f"{r['exec']:.1f}",
         f"{r['shell'] / r['exec']:.0f}x"]
        for r in throughput
    ]  # fmt: skip
    params["aiodocker"] = version("aiodocker")
    return make_result(
        "bench_docker",
        params=params,
        tables=[
            table("Latency of one command (ms)", ["how", "p50", "p95", "mean", "n"], latency_rows),
            table(
                "Lockstep throughput (commands/s)",
                ["B", "shell", "shell, builtin", "exec", "shell/exec"],
                rows,
            ),
        ],
        targets=targets,
        plots=[
            plot(
                "bench_docker.png",
                "Lockstep throughput",
                "containers (B)",
                "commands/s",
                {
                    how: [(r["B"], r[how]) for r in throughput]
                    for how in ("shell", "shell, builtin", "exec")
                },
                logx=True,
                logy=True,
            )
        ],
        notes=[
            f"command: `{params['command']}` (a process per command on every path); "
            f"shell, builtin: `{params['builtin']}` (no process: the framework's round trip)",
            f"our process's CPU per shell command: {builtin['client_cpu_ms']:.3f} ms (builtin), "
            f"{latency['shell']['client_cpu_ms']:.3f} ms (command)",
            "exec = one aiodocker exec per command (create + start + stream + inspect); "
            "cli = one `docker exec` subprocess per command",
        ],
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
