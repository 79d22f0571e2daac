"""An async web service that runs rollouts (Starlette + uvicorn).

    POST /rollouts  {"tasks": [...], "rollouts": 1}  -> {"trajectories": [...], "success": [...]}
    GET  /stats                                       -> concurrency high-water marks

Every request shares ONE limit on live environment instances (containers for
Harbor): the runner's ``instance_limit``. Each request's rollouts take free slots as
they open up (refill), so concurrent requests share the limit without deadlock.
Shutdown (lifespan) tears down every container this service created.

    python examples/service.py                            # CounterEnv, no Docker needed
    python examples/service.py --harbor examples/tasks    # Harbor tasks in containers
    curl -s 127.0.0.1:8000/rollouts -d '{"tasks": [3, 5], "rollouts": 2}'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llenvs_async import Environment, RestoreFn, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import CounterEnv
from llenvs_async.policies import counter_oracle
from llenvs_async.serialization import to_dict


@dataclass(slots=True, kw_only=True)
class Rollouts:
    """The service state: one runner (with its instance limit) shared by all requests."""

    runner: TrajectoryRunner
    requests: int = 0
    peak_requests: int = 0

    async def run(self, tasks: Sequence[int | str]) -> list[Any]:
        self.requests += 1
        self.peak_requests = max(self.peak_requests, self.requests)
        try:
            return await self.runner.run_batch(tasks)
        finally:
            self.requests -= 1


async def rollouts_endpoint(request: Request) -> JSONResponse:
    service: Rollouts = request.app.state.rollouts
    try:
        body = await request.json()
        tasks, n = list(body["tasks"]), int(body.get("rollouts", 1))
        if not tasks or n < 1 or not all(isinstance(t, int | str) for t in tasks):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return JSONResponse({"error": 'expected {"tasks": [task, ...], "rollouts": n}'}, 400)
    trajectories = await service.run([t for t in tasks for _ in range(n)])
    return JSONResponse(
        {
            "trajectories": [to_dict(t) for t in trajectories],
            "success": [t.success for t in trajectories],
        }
    )


async def stats_endpoint(request: Request) -> JSONResponse:
    service: Rollouts = request.app.state.rollouts
    stats, slots = service.runner.stats, service.runner.instance_slots
    assert slots is not None
    return JSONResponse(
        {
            "limit": slots.limit,
            "peak_slots": slots.peak,
            "live_instances": stats.live_instances,
            "peak_live_instances": stats.peak_live_instances,
            "peak_requests": service.peak_requests,
            "completed": stats.completed,
        }
    )


def create_app(*, limit: int = 4, harbor: Path | None = None, epsilon: float = 0.0) -> Starlette:
    """The app; ``harbor`` (a Harbor task directory) runs rollouts in Docker containers."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if harbor is None:
                env, factory, restore, policy = _counter(epsilon)
            else:
                env, factory, restore, policy = await _harbor(stack, harbor, epsilon)
            runner = TrajectoryRunner(
                env,
                ScriptedBackend(policy),
                env_factory=factory,
                restore_fn=restore,
                instance_limit=limit,
            )
            app.state.rollouts = Rollouts(runner=runner)
            yield
            # Shutdown: in-flight batches were finished or cancelled (their instances closed
            # by the runner); the exit stack then removes anything still left (backstop).

    routes = [
        Route("/rollouts", rollouts_endpoint, methods=["POST"]),
        Route("/stats", stats_endpoint, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _counter(epsilon: float) -> tuple[Environment, Any, RestoreFn | None, Any]:
    async def factory() -> Environment:
        return CounterEnv(latency=0.01, max_steps=20)

    return CounterEnv(max_steps=20), factory, None, counter_oracle(epsilon=epsilon)


async def _harbor(
    stack: contextlib.AsyncExitStack, tasks_dir: Path, epsilon: float
) -> tuple[Environment, Any, RestoreFn | None, Any]:
    from llenvs_async.adapters.harbor import HarborAdapter, harbor_oracle, harbor_restore
    from llenvs_async.docker import SESSION_LABEL
    from llenvs_async.docker.engine import DockerEngine

    engine = await stack.enter_async_context(DockerEngine())

    async def remove_session_containers() -> None:
        for item in await engine.list_containers({SESSION_LABEL: engine.session_id}):
            await engine.remove_container(str(item["Id"]))

    stack.push_async_callback(remove_session_containers)  # runs before the engine closes
    adapter = HarborAdapter(engine=engine)
    dataset = await adapter.get_dataset(tasks_dir)

    async def factory() -> Environment:
        return await adapter.get_environment(tasks_dir, max_steps=20)

    def solution(task: int | str | None) -> Sequence[str]:
        return dataset.resolve(task)[1].solution_commands()

    return await factory(), factory, harbor_restore, harbor_oracle(solution, epsilon=epsilon)


async def serve(host: str, port: int, app: Starlette) -> None:
    """Serve until SIGINT/SIGTERM; prints the bound address first (port 0 picks a free one)."""
    sock = socket.create_server((host, port))  # listening already: early clients queue
    print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10)
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--limit", type=int, default=4, help="live rollouts across requests")
    parser.add_argument("--harbor", type=Path, help="Harbor task directory (needs Docker)")
    parser.add_argument("--epsilon", type=float, default=0.0)
    args = parser.parse_args()
    app = create_app(limit=args.limit, harbor=args.harbor, epsilon=args.epsilon)
    # uvicorn shuts down gracefully on SIGINT, then re-raises it: that is the normal exit.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, app))
    print("service stopped", flush=True)


if __name__ == "__main__":
    main()
