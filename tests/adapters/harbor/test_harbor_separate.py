"""Separate verifier environments and artifacts against the real engine: only the artifacts
cross over, the verifier container is labelled, limited and removed, artifacts are kept on
the host in either mode, and an image without ``/tests/test.sh`` is a clear error."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.adapters.harbor import HarborAdapter, oracle_actions
from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL
from llenvs_async.adapters.harbor.verify.verification import ROLE_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import LlenvsError, VerifierError
from llenvs_async.types import Action

from .conftest import harbor_containers

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent / "tasks_real"


async def test_separate_verifier_sees_only_the_artifacts_and_leaves_nothing(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    kept = tmp_path / "kept"
    async with (
        HarborAdapter(cache_dir=tmp_path / "cache", artifacts_dir=kept) as adapter,
        await adapter.get_environment(TASKS / "separate-verifier") as env,
    ):
        state = await env.reset()
        # Doing nothing scores 0: the verifier really checks what arrived.
        idle = await env.step(state, Action(text="SUBMIT"))
        assert idle.reward == 0.0 and "total.txt is not 12" in idle.info["verifier_output"]

        state = await env.reset()
        solve = oracle_actions(env.dataset.tasks[0])[0]
        state = (await env.step(state, Action(text=solve))).next_state
        owner = docker_engine.labels[OWNER_LABEL]
        done = await env.step(state, Action(text="SUBMIT"))  # test.sh checks its own image
        assert done.reward == 1.0, done.info["verifier_output"]
        left = await docker_engine.list_containers({OWNER_LABEL: owner, TASK_IMAGE_LABEL: None})
        assert [c["Labels"].get(ROLE_LABEL) for c in left] == [None]  # the verifier's is gone

    episode = kept / "separate-verifier" / state.episode_id
    assert (episode / "out" / "total.txt").read_text().strip() == "12"
    assert not (episode / "out" / "scratch.tmp").exists()  # exclude = ["*.tmp"]
    assert (episode / "numbers.txt").is_file()
    assert (episode / "logs-artifacts" / "lines.txt").read_text().strip() == "3"
    assert done.info["artifacts_dir"] == str(episode)
    assert await harbor_containers(docker_engine) == []


async def test_verifier_image_without_test_sh_is_a_clear_error(
    tmp_path: Path, adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "separate-verifier"
    shutil.copytree(TASKS / "separate-verifier", task)
    (task / "tests" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")  # no COPY
    async with await adapter.get_environment(task) as env:
        state = await env.reset()
        with pytest.raises(VerifierError, match=r"holds no /tests/test\.sh") as info:
            await env.step(state, Action(text="SUBMIT"))
        assert info.value.kind == "setup"
        assert len(await harbor_containers(docker_engine)) == 1  # the verifier's was removed


async def test_shared_mode_keeps_artifacts_too(tmp_path: Path, docker_engine: DockerEngine) -> None:
    task = tmp_path / "digest-pinned-heredoc"
    shutil.copytree(TASKS / "digest-pinned-heredoc", task)
    toml = task / "task.toml"
    toml.write_text('artifacts = ["/task/report.md", "/task/absent"]\n' + toml.read_text())
    async with (
        HarborAdapter(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "kept") as adapter,
        await adapter.get_environment(task) as env,
    ):
        state = await env.reset()
        solve = oracle_actions(env.dataset.tasks[0])[0]
        state = (await env.step(state, Action(text=solve))).next_state
        done = await env.step(state, Action(text="SUBMIT"))
    assert done.reward == 1.0
    kept = tmp_path / "kept" / "digest-pinned-heredoc" / state.episode_id / "report.md"
    assert kept.read_text().startswith("# Report")
    manifest = {a["source"]: a for a in done.info["artifacts"]}
    assert manifest["/task/absent"] == {"source": "/task/absent", "missing": True}


@pytest.mark.parametrize("how", ["cancel", "close"])
async def test_verifier_container_goes_on_cancel_and_on_close(
    tmp_path: Path, adapter: HarborAdapter, docker_engine: DockerEngine, how: str
) -> None:
    task = tmp_path / "separate-verifier"
    shutil.copytree(TASKS / "separate-verifier", task)
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text("#!/bin/bash\nsleep 120\n" + test_sh.read_text())  # a slow verifier
    owner = docker_engine.labels[OWNER_LABEL]

    async def verifiers() -> list[dict[str, object]]:
        return await docker_engine.list_containers({OWNER_LABEL: owner, ROLE_LABEL: "verifier"})

    env = await adapter.get_environment(task)
    try:
        state = await env.reset()
        submit = asyncio.create_task(env.step(state, Action(text="SUBMIT")))
        async with asyncio.timeout(120):
            while not await verifiers():  # until the verifier container is up
                await asyncio.sleep(0.05)
        if how == "cancel":
            submit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await submit
            assert await verifiers() == []
            assert len(await harbor_containers(docker_engine)) == 1  # the agent's stays
        else:
            await env.aclose()  # closing the instance removes its verifier's container too
            async with asyncio.timeout(60):  # the verification fails at once (not after 120 s)
                with pytest.raises(LlenvsError):
                    await submit
            assert await verifiers() == []
    finally:
        await env.aclose()
    assert await harbor_containers(docker_engine) == []
