"""Snapshot-fork restore for Harbor tasks: the docker layer's ``SnapshotFork`` keyed by the
task image, the task name and the prefix of commands, replayed and re-anchored as
``harbor_restore`` does (task identity checked, budget restored).

See ``llenvs_async.fork`` for what a fork keeps (filesystem, cwd, umask, exports)
and when it falls back to a replay (processes left running, a failed commit);
``processes=True`` forks whole boxes with the process fork of their runtime (gVisor's).
"""

from __future__ import annotations

from typing import Any

from ....docker.engine import DockerEngine
from ....env import Environment
from ....fork import (
    ShellState,
    SnapshotFork,
    SnapshotKey,
    SnapshotStats,
    apply_shell_state,
    capture_shell_state,
    prefix_digest,
)
from ....types import State
from ..episode.environment import HarborEnvironment
from .replay import check_restorable, reanchor, replay_prefix

__all__ = [
    "ShellState",
    "SnapshotRestore",
    "SnapshotStats",
    "apply_shell_state",
    "capture_shell_state",
]


class SnapshotRestore(SnapshotFork[HarborEnvironment]):
    """A ``RestoreFn`` for ``HarborEnvironment``: replay each distinct state once, fork the rest.

    Give it to a runner used as ``async with TrajectoryRunner(..., restore_fn=SnapshotRestore())``
    so its snapshot images are removed at teardown. ``engine`` (owned by the caller) is
    used to resolve task images and remove snapshots; by default the adapter's engine, else
    one is opened. ``timeout`` bounds a commit, and the removal of the snapshots.
    ``processes=True`` (``runtime="gvisor"``): fork whole sandboxes, processes and the
    shell's full state included; on runc that is a ``RestoreError`` at the first restore.
    """

    def _check(self, env: Environment, state: State) -> HarborEnvironment:
        return check_restorable(env, state, "SnapshotRestore")

    async def _key(self, env: HarborEnvironment, state: State) -> SnapshotKey:
        _, task = env.dataset.resolve(state.task)
        image = await env.runtime.images.ensure(await self._engine_for(env), task)
        return SnapshotKey(image=image, task=task.name, prefix=prefix_digest(state, env.commands))

    async def _replay(self, env: HarborEnvironment, state: State) -> State:
        return await replay_prefix(env, state)

    def _reanchor(
        self, env: HarborEnvironment, state: State, started: float, info: dict[str, Any]
    ) -> State:
        return reanchor(env, state, started=started, info=info)

    async def _open_engine(self, env: HarborEnvironment) -> tuple[DockerEngine, bool]:
        if env.runtime.engine is not None:
            return await env.runtime.engine.connect(), False  # the adapter's
        return await DockerEngine(env.runtime.docker_url).connect(), True
