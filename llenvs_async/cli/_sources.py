"""Where rollouts come from: a built-in pure/stateful env by name, or a Harbor dataset.

A ``SourceSpec`` is what a results file records, so ``q-values`` can rebuild the
same environment; ``open_source`` turns it into a live ``Source``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from ..env import EnvFactory, Environment
from ..envs import ArithmeticEnv, ChainEnv, CounterEnv
from ..policies import arithmetic_oracle, chain_oracle, counter_oracle
from ._common import CliError
from ._harbor import open_harbor
from ._source_types import BUILTIN_ENVS, Source, SourceSpec, TaskRef

__all__ = [
    "BUILTIN_ENVS",
    "Source",
    "SourceSpec",
    "TaskRef",
    "open_source",
    "select_tasks",
]

_COUNTER_TARGETS = (1, 2, 3, 4, 5)


def _builtin(spec: SourceSpec) -> Source:
    steps = spec.max_steps
    factory: EnvFactory | None = None
    env: Environment
    if spec.env == "arithmetic":
        arith = ArithmeticEnv(num_tasks=20, max_steps=steps or 3)
        env, oracle = arith, arithmetic_oracle
        tasks = [TaskRef(key=i, task=i, description=arith.problem(i)[0]) for i in range(20)]

    elif spec.env == "chain":
        chain = ChainEnv(max_steps=steps or 10)
        env, oracle = chain, chain_oracle
        tasks = [
            TaskRef(key=i, task=i, description=f"corridor of length {chain.min_length + i}")
            for i in range(chain.num_tasks)
        ]
    else:

        async def factory() -> Environment:
            return CounterEnv(max_steps=steps or 20)

        env, oracle = CounterEnv(max_steps=steps or 20), counter_oracle
        tasks = [TaskRef(key=t, task=t, description=f"count to {t}") for t in _COUNTER_TARGETS]
    return Source(
        spec=spec, environment=env, env_factory=factory, restore_fn=None, tasks=tasks,
        oracle=lambda eps, seed: oracle(epsilon=eps, seed=seed),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def open_source(spec: SourceSpec) -> AsyncIterator[Source]:
    """Open ``spec``'s environment (and, for Harbor, its dataset); close it on exit."""
    if spec.env is not None:
        source = _builtin(spec)
    else:
        source = await open_harbor(spec)
    try:
        yield source
    finally:
        try:
            await source.environment.aclose()
        finally:
            if source.close is not None:
                await source.close()


def select_tasks(
    tasks: Sequence[TaskRef], selectors: Sequence[str], limit: int | None
) -> list[TaskRef]:
    """The tasks named by ``selectors`` (keys, short names or positions), else all; then
    the first ``limit``.
    """
    chosen = list(tasks)
    if selectors:
        chosen = [_find(tasks, s) for s in selectors]
    if limit is not None:
        if limit < 1:
            raise CliError(f"--limit must be >= 1, got {limit}")
        chosen = chosen[:limit]
    return chosen


def _find(tasks: Sequence[TaskRef], selector: str) -> TaskRef:
    for ref in tasks:
        if str(ref.key) == selector or str(ref.key).rsplit("/", 1)[-1] == selector:
            return ref
    if selector.isdigit() and int(selector) < len(tasks):
        return tasks[int(selector)]
    known = ", ".join(str(t.key) for t in tasks[:8])
    raise CliError(f"unknown task {selector!r} (known: {known}{', ...' if len(tasks) > 8 else ''})")
