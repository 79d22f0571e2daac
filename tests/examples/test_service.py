from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.cli._docker import containers_of

from .conftest import EXAMPLES, load_example

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

service = load_example("service.py")


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    """The counter-env service on a free 127.0.0.1 port, limit 3, stopped after the test."""
    config = uvicorn.Config(
        service.create_app(limit=3), host="127.0.0.1", port=0, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task


async def test_concurrent_requests_share_one_rollout_limit(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        replies = await asyncio.gather(
            *(
                client.post("/rollouts", json={"tasks": [2, 3, 4, 5], "rollouts": 1})
                for _ in range(4)
            )
        )
        stats = (await client.get("/stats")).json()
    for reply in replies:
        assert reply.status_code == 200
        body = reply.json()
        assert body["success"] == [True] * 4
        assert [t["initial_state"]["task"] for t in body["trajectories"]] == [2, 3, 4, 5]
    assert stats["peak_requests"] >= 2  # the requests did overlap...
    assert stats["peak_slots"] == stats["limit"] == 3  # ...yet never held more than the limit
    assert stats["peak_live_instances"] == 3  # counted on the real instances, not the slots
    assert stats["live_instances"] == 0
    assert stats["completed"] == 16


async def test_bad_request_is_a_400(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        for body in ({"tasks": []}, {"nope": 1}, {"tasks": [1], "rollouts": 0}):
            reply = await client.post("/rollouts", json=body)
            assert reply.status_code == 400
            assert "expected" in reply.json()["error"]


@pytest.mark.docker
@pytest.mark.slow
async def test_harbor_service_shutdown_leaves_no_container(docker_ready: None) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / "service.py"), "--port", "0", "--limit", "2",
        "--harbor", str(EXAMPLES / "tasks"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("listening on "), line + (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        async with httpx.AsyncClient(base_url=line.split()[-1], timeout=120) as client:
            body: dict[str, Any] = {"tasks": ["csv-totals", "json-config"], "rollouts": 1}
            replies = await asyncio.gather(*(client.post("/rollouts", json=body) for _ in range(2)))
            assert [r.json()["success"] for r in replies] == [[True, True]] * 2
            stats = (await client.get("/stats")).json()
            assert stats["peak_live_instances"] == 2 and stats["peak_requests"] == 2
            # Shut down while a batch runs: its containers must go too.
            late = asyncio.create_task(
                client.post("/rollouts", json={"tasks": ["build-release"] * 2})
            )
            async with asyncio.timeout(60):
                while not await containers_of(proc.pid):
                    assert not late.done()
                    await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            await asyncio.gather(late, return_exceptions=True)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert await containers_of(proc.pid) == []
