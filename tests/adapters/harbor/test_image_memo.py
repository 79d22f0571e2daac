"""A task's build context is tarred and hashed once per adapter, not on every reset."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters.harbor import HarborAdapter
from llenvs_async.adapters.harbor.images import image
from llenvs_async.docker.engine import DockerEngine

from .conftest import EXAMPLES

pytestmark = pytest.mark.docker


async def test_context_is_hashed_once_per_task(
    tmp_path: Path, docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = image.context_tar

    def counting(task: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(task.name)
        return real(task, *args, **kwargs)

    monkeypatch.setattr(image, "context_tar", counting)
    async with HarborAdapter(cache_dir=tmp_path) as adapter:
        dataset = await adapter.get_dataset(EXAMPLES)
        task = dataset.tasks[dataset.index_of("csv-totals")]
        tags = await asyncio.gather(*(adapter.images.ensure(docker_engine, task) for _ in range(8)))
        again = await adapter.images.ensure(docker_engine, task)
    assert len(set(tags)) == 1 and again == tags[0]
    assert calls == [task.name]  # eight concurrent resets and one more: one tar
