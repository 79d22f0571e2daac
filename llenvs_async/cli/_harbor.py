"""Harbor datasets as CLI sources: adapter, factory, ``harbor_restore`` and the oracle."""

from __future__ import annotations

from ..adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    HarborTask,
    harbor_restore,
    start_at_step,
)
from ..adapters.harbor.oracle import dataset_oracle
from ..docker.engine import DockerEngine
from ..env import Environment
from ..policies import OraclePolicy
from ..types import State
from ._common import CliError
from ._source_types import Source, SourceSpec, TaskRef

__all__ = [
    "DEFAULT_MAX_STEPS",
    "describe",
    "open_harbor",
]

DEFAULT_MAX_STEPS = 30


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
    adapter = HarborAdapter(settings=options)
    dataset = await adapter.get_dataset(spec.dataset)
    max_steps = spec.max_steps or DEFAULT_MAX_STEPS

    async def factory() -> Environment:
        return await adapter.get_environment(spec.dataset or "", max_steps=max_steps)

    def oracle(epsilon: float, seed: int) -> OraclePolicy:
        return dataset_oracle(dataset, epsilon=epsilon, seed=seed)

    tasks = [TaskRef(key=t.name, task=t.name, description=describe(t)) for t in dataset.tasks]
    # A task that cannot load is still listed (last): its rollouts record its TaskLoadError.
    tasks += [
        TaskRef(key=name, task=name, description=f"(cannot load: {' '.join(str(exc).split())})")
        for name, exc in dataset.unloadable.items()
    ]

    start = None
    if options.start_step is not None:
        step = options.start_step

        async def start(env: Environment, ref: TaskRef, seed: int | None) -> State:
            if not isinstance(env, HarborEnvironment):  # a Ray actor's proxy
                raise CliError("--start-step runs in this process (not with --ray-address)")
            return await start_at_step(env, ref.task, step, seed=seed)

    async def preflight() -> None:
        async with DockerEngine() as engine:
            await engine.connect()

    return Source(
        spec=spec, environment=await factory(), env_factory=factory, restore_fn=harbor_restore,
        tasks=tasks, oracle=oracle, preflight=preflight,
        start=start, close=adapter.aclose,
    )  # fmt: skip
