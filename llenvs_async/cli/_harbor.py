"""Harbor datasets as CLI sources: adapter, factory, ``harbor_restore`` and the solution oracle."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Literal

from ..adapters.harbor import HarborAdapter, HarborDataset, HarborTask, harbor_restore
from ..adapters.harbor.steps import oracle_actions
from ..docker.engine import DockerEngine
from ..env import Environment
from ..policies import OraclePolicy, harbor_mistakes, harbor_oracle
from ._sources import Source, SourceSpec, TaskRef

__all__ = [
    "DEFAULT_MAX_STEPS",
    "SYSTEM_PROMPT",
    "describe",
    "open_harbor",
    "solution_lookup",
]

DEFAULT_MAX_STEPS = 30
SYSTEM_PROMPT = (
    "You are an agent working in a Linux shell to complete the task you are given. "
    "Each reply is ONE shell command in a ```bash fenced block; you will see its output. "
    "When the task is complete, reply with the single word SUBMIT."
)


def solution_lookup(dataset: HarborDataset) -> Callable[[int | str | None], Sequence[str]]:
    """``task -> solution commands`` (solve.sh as one oracle action; a multi-step task's
    step solutions in turn, ``SUBMIT`` between them), cached."""
    cache: dict[int | str | None, Sequence[str]] = {}

    def lookup(task: int | str | None) -> Sequence[str]:
        if task not in cache:
            cache[task] = oracle_actions(dataset.resolve(task)[1])
        return cache[task]

    return lookup


def describe(task: HarborTask) -> str:
    """The task's one-line description, else its instruction's first line."""
    info = task.config.task
    if info is not None and info.description:
        return info.description
    return next((line for line in task.instruction.splitlines() if line.strip()), "")


async def open_harbor(spec: SourceSpec) -> Source:
    """A Harbor source: one fresh container-backed instance per rollout, tasks keyed by name."""
    assert spec.dataset is not None
    options = spec.harbor
    adapter = HarborAdapter(
        allow_network=options.allow_network,
        base_image_aliases=options.base_images,
        build_network=options.build_network,
        build_ca_bundle=options.build_ca_bundle,
        provision_verifier=options.provision_verifier,
        runtime="gvisor" if options.runtime == "gvisor" else "runc",
    )
    dataset = await adapter.get_dataset(spec.dataset)
    max_steps = spec.max_steps or DEFAULT_MAX_STEPS
    command_timeout: float | Literal["task"] = options.command_timeout or "task"

    async def factory() -> Environment:
        return await adapter.get_environment(
            spec.dataset or "", max_steps=max_steps, command_timeout_sec=command_timeout
        )

    solutions = solution_lookup(dataset)

    @functools.cache
    def mistakes(task: int | str | None) -> Sequence[str]:
        return harbor_mistakes(dataset.resolve(task)[1].declared_workdir)

    def oracle(epsilon: float, seed: int) -> OraclePolicy:
        return harbor_oracle(solutions, epsilon=epsilon, seed=seed, mistakes=mistakes)

    tasks = [TaskRef(key=t.name, task=t.name, description=describe(t)) for t in dataset.tasks]
    # A task that cannot load is still listed (last): its rollouts record its TaskLoadError.
    tasks += [
        TaskRef(key=name, task=name, description=f"(cannot load: {' '.join(str(exc).split())})")
        for name, exc in dataset.unloadable.items()
    ]

    async def preflight() -> None:
        async with DockerEngine() as engine:
            await engine.connect()

    return Source(
        spec=spec, environment=await factory(), env_factory=factory, restore_fn=harbor_restore,
        tasks=tasks, oracle=oracle, system_prompt=SYSTEM_PROMPT, preflight=preflight,
        close=adapter.aclose,
    )  # fmt: skip
