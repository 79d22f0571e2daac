"""Compose sidecars: the supported subset parsed (anything else a clear error), and on a real
engine sidecars joined pod-style to the main container, labelled, limited, awaited through
their healthcheck and removed with their instance."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.adapters.harbor import HarborAdapter, load_task
from llenvs_async.adapters.harbor.episode.sidecars import SIDECAR_LABEL
from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL
from llenvs_async.adapters.harbor.tasks.compose import parse_compose, parse_duration
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import ContainerError, TaskLoadError
from llenvs_async.types import Action

from .conftest import harbor_containers

REAL = Path(__file__).resolve().parent / "tasks_real" / "compose-sidecar"


def _compose(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "docker-compose.yaml"
    path.write_text(text)
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    return path


def test_the_real_task_parses_into_main_and_one_sidecar() -> None:
    task = load_task(REAL)
    assert task.compose is not None
    assert task.compose.main.environment == {"KV_URL": "http://kv:8765"}
    assert task.compose.main.depends_on == {"kv": "service_healthy"}
    (kv,) = task.compose.sidecars
    assert kv.name == "kv"
    assert kv.build_context == (REAL / "environment" / "kv").resolve()
    assert kv.command == ("python3", "/srv/kv.py", "8765")
    assert kv.healthcheck is not None
    assert (kv.healthcheck.interval_sec, kv.healthcheck.retries) == (1.0, 30)
    assert kv.healthcheck.argv[:2] == ("python3", "-c")


def test_start_order_follows_depends_on_and_forms_are_normalised(tmp_path: Path) -> None:
    path = _compose(
        tmp_path,
        """
services:
  main: {build: .}
  web:
    image: llenvs/base:bookworm
    command: python3 -m http.server 80
    depends_on: [db]
    environment: [A=1, B=x=y]
    healthcheck: {test: "true", interval: 1m30s, start_period: 500ms}
  db:
    image: llenvs/base:bookworm
    environment: {N: 3, FLAG: true}
    healthcheck: {test: [CMD-SHELL, "exit 0"], disable: false}
""",
    )
    spec = parse_compose(path.read_text(), path=path)
    assert [s.name for s in spec.sidecars] == ["db", "web"]
    db, web = spec.sidecars
    assert web.command == ("python3", "-m", "http.server", "80")
    assert web.environment == {"A": "1", "B": "x=y"}
    assert db.environment == {"N": "3", "FLAG": "true"}
    assert web.healthcheck is not None and web.healthcheck.argv == ("/bin/sh", "-c", "true")
    assert (web.healthcheck.interval_sec, web.healthcheck.start_period_sec) == (90.0, 0.5)
    assert db.healthcheck is not None and db.healthcheck.argv == ("/bin/sh", "-c", "exit 0")
    assert spec.service_names == ("main", "db", "web")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            "services:\n  main: {build: .}\nvolumes: {data: {}}\n",
            ("field 'volumes'", "not supported"),
        ),
        (
            "services:\n  main: {build: .}\n  db: {image: x, privileged: true}\n",
            ("field 'services.db.privileged'", "(value True)", "not supported for a sidecar"),
        ),
        (
            "services:\n  main: {build: .}\n  db: {image: x, network_mode: host}\n",
            ("services.db.network_mode", "'host'"),
        ),
        ("services:\n  db: {image: x}\n", ("field 'services'", "'main' service")),
        ("services:\n  main: {build: ./other}\n", ("services.main.build", "Dockerfile")),
        ("services:\n  main: {build: ., command: x}\n", ("services.main.command",)),
        ("services:\n  main: {build: .}\n  db: {command: x}\n", ("exactly one of image or build",)),
        (
            "services:\n  main: {build: .}\n  db: {image: x, depends_on: [nope]}\n",
            ("services.db.depends_on", "'nope'"),
        ),
        (
            "services:\n  main: {build: .}\n  a: {image: x, depends_on: [b]}\n"
            "  b: {image: x, depends_on: [a]}\n",
            ("depends_on cycle", "a -> b -> a"),
        ),
        (
            "services:\n  main: {build: .}\n"
            "  db: {image: x, healthcheck: {test: 'true', interval: soon}}\n",
            ("services.db.healthcheck.interval", "'soon'", "duration"),
        ),
        (
            "services:\n  main: {build: .}\n"
            "  db:\n    image: x\n    depends_on: {main: {condition: x}}\n",
            ("services.db.depends_on.main", "condition must be one of"),
        ),
        ("services: [oops\n", ("is not valid YAML",)),
    ],
)
def test_unsupported_or_bad_compose_names_file_field_and_value(
    tmp_path: Path, body: str, words: tuple[str, ...]
) -> None:
    path = _compose(tmp_path, body)
    with pytest.raises(TaskLoadError) as info:
        parse_compose(body, path=path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, (word, message)


def test_durations() -> None:
    assert parse_duration("1m30s", what="x", path="p") == 90.0
    assert parse_duration("250ms", what="x", path="p") == 0.25
    assert parse_duration(5, what="x", path="p") == 5.0
    with pytest.raises(TaskLoadError):
        parse_duration("5 s", what="x", path="p")


def _task_with_sidecar(tmp_path: Path, healthcheck: str) -> Path:
    root = tmp_path / "tasks" / "compose-sidecar"
    shutil.copytree(REAL, root)
    compose = root / "environment" / "docker-compose.yaml"
    text = compose.read_text()
    start = text.index("    healthcheck:")
    compose.write_text(text[:start] + healthcheck)
    return root.parent


@pytest.mark.docker
async def test_sidecar_is_pod_joined_labelled_limited_and_removed_with_its_instance(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    async with (
        HarborAdapter(cache_dir=tmp_path / "cache", engine=docker_engine) as adapter,
        await adapter.get_environment(REAL) as env,
    ):
        state = await env.reset(0)
        main = env.container
        assert main is not None
        ours = await harbor_containers(docker_engine)
        assert len(ours) == 2 and main.id in ours
        (sidecar_id,) = set(ours) - {main.id}
        info = await docker_engine.client.containers.container(sidecar_id).show()
        host = info["HostConfig"]
        assert host["NetworkMode"] == f"container:{main.id}"
        assert (host["Privileged"], host["PidsLimit"]) == (False, 512)
        assert host["Memory"] == env.dataset.tasks[0].config.environment.memory_mb << 20
        assert "no-new-privileges:true" in host["SecurityOpt"]
        labels = info["Config"]["Labels"]
        assert labels[SIDECAR_LABEL] == "kv"
        assert labels[TASK_IMAGE_LABEL] == "llenvs-real/compose-sidecar"
        assert labels[OWNER_LABEL] == docker_engine.labels[OWNER_LABEL]  # the reaper's key
        # the main container reaches the sidecar by its service name, on the shared loopback
        step = await env.step(state, Action(text="getent hosts kv; " + _put("k", "v")))
        assert "127.0.0.1" in step.next_state.observation.text, step.next_state.observation.text
        done = await env.step(step.next_state, Action(text="SUBMIT"))
        assert done.reward == 1.0
        second = await env.reset(0)  # a new episode: the old sidecar went with the old main
        assert len(await harbor_containers(docker_engine)) == 2
        assert sidecar_id not in await harbor_containers(docker_engine)
        assert second.step == 0
    assert await harbor_containers(docker_engine) == []


def _put(key: str, value: str) -> str:
    return (
        'python3 -c "import os, urllib.request as u; u.urlopen(u.Request('
        f"os.environ['KV_URL'] + '/{key}', data=b'{value}', method='PUT'))\""
    )


@pytest.mark.docker
async def test_a_sidecar_failing_its_healthcheck_fails_the_reset_and_leaves_nothing(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    tasks = _task_with_sidecar(
        tmp_path,
        "    healthcheck:\n"
        "      test: [CMD-SHELL, 'echo kv is not ready >&2; exit 1']\n"
        "      interval: 100ms\n"
        "      retries: 2\n",
    )
    async with (
        HarborAdapter(cache_dir=tmp_path / "cache", engine=docker_engine) as adapter,
        await adapter.get_environment(tasks) as env,
    ):
        with pytest.raises(ContainerError) as info:
            await env.reset(0)
        message = str(info.value)
        assert "sidecar 'kv' failed its healthcheck 2 time(s) in a row" in message
        assert "kv is not ready" in message
        assert len(message) < 600
        assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
async def test_cancelling_a_reset_while_a_sidecar_is_awaited_leaves_nothing(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    tasks = _task_with_sidecar(
        tmp_path,
        "    healthcheck:\n      test: [CMD-SHELL, 'exit 1']\n      interval: 200ms\n"
        "      retries: 1000\n",
    )
    async with (
        HarborAdapter(cache_dir=tmp_path / "cache", engine=docker_engine) as adapter,
        await adapter.get_environment(tasks) as env,
    ):
        reset = asyncio.create_task(env.reset(0))
        for _ in range(600):  # until the sidecar exists (main first, then kv), then cancel
            ours = {OWNER_LABEL: docker_engine.labels[OWNER_LABEL], SIDECAR_LABEL: "kv"}
            found = await docker_engine.list_containers(ours)
            if found or reset.done():
                break
            await asyncio.sleep(0.1)
        assert found and not reset.done()
        reset.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reset
        assert await harbor_containers(docker_engine) == []
