"""Docker preconditions the integrations' Harbor tests share (synchronous fixtures: the
trainers call us from plain threads, so these tests are not async)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._support import base_image_engine, harbor_containers


async def _task_containers() -> list[str]:
    """This process's Harbor task containers, once Docker and the base image are checked
    (skips, failing under CI, when Docker or the image is missing)."""
    async with base_image_engine() as engine:
        return await harbor_containers(engine)


@pytest.fixture
def docker_images() -> None:
    """Docker answers and the base image is built."""
    asyncio.run(_task_containers())


@pytest.fixture
def no_containers_left() -> Iterator[None]:
    """Docker preconditions, and "0 task containers of ours" before and after the test."""
    assert asyncio.run(_task_containers()) == []
    yield
    assert asyncio.run(_task_containers()) == [], "the test left Harbor containers behind"


def cpu_grpo_config(out: Path, *, max_steps: int, learning_rate: float) -> Any:
    """TRL's ``GRPOConfig`` for a small GRPO run on the CPU: groups of 4, one group a step,
    no KL term, a log line per step, nothing saved, seeded."""
    import trl

    return trl.GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=max_steps,
        learning_rate=learning_rate,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        seed=0,
    )
