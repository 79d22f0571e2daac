"""Snapshot-fork restore, generic over shell-task environments: replay a state once, commit
the container, start the other instances from that image.

Replay restore costs every instance a container start plus the whole prefix. For Monte
Carlo estimates the B rollouts usually start from the same state, so ``SnapshotFork``
groups concurrent restores by ``SnapshotKey`` (image, task, prefix of commands): the first
caller replays the prefix in its own instance, commits that container to a snapshot image
and continues live; the others wait, then start from the snapshot. Snapshots are cached for
the life of the object and removed by ``aclose``. A subclass says how its environment is
checked, keyed, replayed and re-anchored (``HarborEnvironment``: ``harbor.SnapshotRestore``).

A commit keeps the filesystem only. Restored in the forked shells: the working
directory, the umask and the exported variables (set, changed or removed; not
``HOSTNAME``, which is per container). NOT restored: unexported shell variables,
functions, aliases, shell options, traps and the directory stack. Processes do not
survive a commit either: when the replayed prefix leaves any running (background
jobs, daemons), that state falls back to replay restore for every instance.

With ``processes=True`` the first instance checkpoints its whole replayed box instead,
with the ``ProcessFork`` its runtime offers (``Runtime.process_fork``; gVisor's
``SandboxProcessFork``); every instance, that one included, continues in a box restored
from it, processes, memory and the shell's state intact (``{"method": "checkpoint",
"checkpoint": name}``). A runtime without checkpoints is a ``RestoreError``.

Each restored state records how in ``state.info["restore"]``: ``{"method":
"snapshot", "image": ref}`` for a forked instance, ``{"method": "replay",
"snapshot": ref}`` for the instance that replayed and committed, and ``{"method":
"replay", "fallback_reason": why}`` for a replay instead of a fork.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from ._ownership import new_session_id
from ._resource import AsyncResource
from ._shield import shielded
from .docker.engine import DockerEngine
from .docker.images import tag_slug
from .docker.runtime import ForkPoint, ProcessFork, RuntimeHost, get_runtime, runtime_names
from .docker.snapshots import (
    CommittedImage,
    register_snapshot_backstop,
    remove_image,
    snapshot_labels,
)
from .env import Environment
from .errors import ClosedError, ContainerError, EnvError, LlenvsError, RestoreError
from .host import ShellSession, ShellState, apply_shell_state, capture_shell_state, run_probe
from .types import Action, State

__all__ = [
    "SNAPSHOT_REPO",
    "CommittedImage",
    "Forkable",
    "ShellState",
    "SnapshotFork",
    "SnapshotKey",
    "SnapshotStats",
    "apply_shell_state",
    "capture_shell_state",
    "prefix_digest",
]

SNAPSHOT_REPO = "llenvs-snapshot"
# Lists the container's processes from a subshell, with builtins only (no process of its
# own but the subshell): a header "SHELL_PID SUBSHELL_PID", then "PID PPID STATE COMM".
_PROCESSES = r"""( read -r __llenvs_self __llenvs_rest </proc/self/stat
echo "$$ $__llenvs_self"
for __llenvs_d in /proc/[0-9]*; do
  read -r __llenvs_l 2>/dev/null <"$__llenvs_d/stat" || continue
  __llenvs_c=${__llenvs_l#*(}; __llenvs_c=${__llenvs_c%)*}
  set -- ${__llenvs_l##*)}
  echo "${__llenvs_d#/proc/} $2 $1 $__llenvs_c"
done )"""


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """Counters: prefixes replayed, snapshots committed, instances forked, replay fallbacks."""

    replays: int = 0
    snapshots: int = 0
    forks: int = 0
    fallbacks: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotKey:
    """What a snapshot is shared by: the image the episode ran in, its task, its prefix."""

    image: str
    task: str
    prefix: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.image, self.task, self.prefix]).encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class _Snapshot:
    image: str
    template: State
    shell: ShellState


@dataclass(frozen=True, slots=True, kw_only=True)
class _Fallback:
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _Checkpointed:
    checkpoint: ForkPoint
    template: State


_Outcome = _Snapshot | _Fallback | _Checkpointed


def prefix_digest(state: State, commands_of: Callable[[Action], Sequence[str]]) -> str:
    """SHA-256 of the commands ``state.actions`` run (what the container state depends on),
    as the environment's protocol reads them (``commands_of``)."""
    commands = [list(commands_of(action)) for action in state.actions]
    return hashlib.sha256(json.dumps(commands).encode()).hexdigest()


def _leftover_processes(listing: str) -> list[str]:
    """The processes of a ``_PROCESSES`` listing other than init, the container's command,
    the shell and the probe, as ``"comm (pid N)"``."""
    header, *lines = listing.splitlines()
    ours = {1, *(int(pid) for pid in header.split())}
    procs = [line.split(" ", 3) for line in lines]
    # Containers run with Init: the first child of PID 1 is the container's own command.
    ours.add(min((int(pid) for pid, ppid, _, _ in procs if ppid == "1"), default=1))
    return [
        f"{comm} (pid {pid})"
        for pid, _, status, comm in procs
        if int(pid) not in ours and status != "Z"
    ]


async def _remove_images(engine: DockerEngine, refs: Sequence[str]) -> list[str]:
    """Remove images concurrently; ``"ref: error"`` for each that could not be removed
    (by id, an image a running container uses is refused rather than left untagged)."""
    await engine.connect()  # an idle owner may have disconnected it (reconnects; idempotent)

    async def remove(ref: str) -> str | None:
        try:
            await remove_image(engine, ref)
        except ContainerError as exc:
            return f"{ref}: {exc}"
        return None

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(remove(ref)) for ref in refs]
    return [error for task in tasks if (error := task.result()) is not None]


class Forkable(Protocol):
    """What ``SnapshotFork`` needs of an environment: its live shell and container (or other
    box), the runtime its boxes run on, and a way to continue a state in a new container
    started from an image."""

    @property
    def shell(self) -> ShellSession | None: ...

    @property
    def container(self) -> RuntimeHost | None: ...

    @property
    def container_runtime(self) -> str: ...

    async def resume(self, point: CommittedImage, state: State) -> State:
        """Continue ``state`` in a new box started from ``point``."""
        ...


E = TypeVar("E", bound=Forkable)


class SnapshotFork(AsyncResource, Generic[E]):
    """A ``RestoreFn``: replay each distinct state once, fork the rest (see the module doc).

    Subclasses give ``_check`` (the environment as ``E``, or an error), ``_key``,
    ``_replay`` (reset + replay the prefix) and ``_reanchor`` (the restored state, with
    ``info`` merged). ``engine`` (owned by the caller) removes snapshots; by default the
    subclass's ``_open_engine`` gives one. ``timeout`` bounds a commit, and the removal.
    ``processes=True``: fork whole boxes, processes included, with the process fork that
    the environment's runtime offers (``Runtime.process_fork``; closed with this object).
    """

    def __init__(
        self, *, engine: DockerEngine | None = None, timeout: float = 120.0, processes: bool = False
    ) -> None:
        self.session_id = new_session_id()
        self.timeout = timeout
        self.processes = processes
        self.process_fork: ProcessFork[E, Any] | None = None  # made at the first restore
        self._engine = engine
        self._owns_engine = False
        self._engine_lock = asyncio.Lock()
        self._entries: dict[SnapshotKey, asyncio.Future[_Outcome]] = {}
        self._images: dict[str, str] = {}  # ref -> image id once committed (removal target)
        self._stats = SnapshotStats()
        self._closed = False

    @property
    def stats(self) -> SnapshotStats:
        return self._stats

    @property
    def images(self) -> tuple[str, ...]:
        """The snapshot images held (removed by ``aclose``)."""
        return tuple(self._images)

    async def __call__(self, env: Environment, state: State) -> State:
        """Restore ``env`` to ``state`` (checks and errors as the subclass's ``_check``)."""
        if self._closed:
            raise ClosedError(type(self).__name__)
        forkable = self._check(env, state)
        if self.processes:
            self._process_fork_on(forkable.container_runtime, env)
        started = time.monotonic()
        if not state.actions:
            return await self._fallback(forkable, state, started, "empty prefix: nothing to fork")
        key = await self._key(forkable, state)
        entry = self._entries.get(key)
        if entry is None:
            return await self._lead(forkable, state, key, started)
        try:
            outcome = await asyncio.shield(entry)
        except RestoreError as exc:
            return await self._fallback(forkable, state, started, str(exc))
        if isinstance(outcome, _Fallback):
            return await self._fallback(forkable, state, started, outcome.reason)
        return await self._fork(forkable, state, outcome, started)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Remove every snapshot image (idempotent; shielded from cancellation)."""
        if self._closed:
            return
        self._closed = True
        if self.process_fork is not None:
            await self.process_fork.aclose()
        images, self._images = list(self._images.values()), {}
        engine, self._engine = self._engine, None
        if engine is None:
            return
        try:
            failed = await shielded(_remove_images(engine, images), within=self.timeout)
        finally:
            if self._owns_engine:
                await shielded(engine.aclose(), within=self.timeout)
        if failed:
            raise ContainerError(f"could not remove snapshot images: {'; '.join(failed)}")

    def _process_fork_on(self, runtime: str, env: Environment) -> None:
        """Make the process fork of ``runtime`` at the first restore; a ``RestoreError`` when
        that runtime has no checkpoints or differs from the first restore's."""
        fork = self.process_fork
        if fork is None and "checkpoint" in get_runtime(runtime).capabilities:
            self.process_fork = fork = get_runtime(runtime).process_fork(timeout=self.timeout)
        if fork is None or fork.runtime != runtime:
            able = [n for n in runtime_names() if "checkpoint" in get_runtime(n).capabilities]
            wanted = " or ".join(repr(n) for n in ([fork.runtime] if fork else able))
            raise RestoreError(
                f"{type(self).__name__}(processes=True) forks whole boxes with their processes "
                f"and needs a runtime that checkpoints them ({wanted}: HarborAdapter(runtime=...), "
                f"--runtime); this {type(env).__name__} runs on {runtime!r}",
                runtime=runtime,
            )

    # -- what a subclass gives ---------------------------------------------------------------

    def _check(self, env: Environment, state: State) -> E:
        """``env`` as the environment type this restore knows, or raise ``RestoreError``."""
        raise NotImplementedError

    async def _key(self, env: E, state: State) -> SnapshotKey:
        """The key concurrent restores of ``state`` share (see ``prefix_digest``)."""
        raise NotImplementedError

    async def _replay(self, env: E, state: State) -> State:
        """Reset ``env`` to ``state.task`` and replay ``state.actions``; the state reached."""
        raise NotImplementedError

    def _reanchor(self, env: E, state: State, started: float, info: dict[str, Any]) -> State:
        """The restored state (``started``: when the restore began; ``info`` to merge)."""
        raise NotImplementedError

    async def _open_engine(self, env: E) -> tuple[DockerEngine, bool]:
        """An engine when none was given, and whether this object owns (closes) it."""
        return await DockerEngine().connect(), True

    async def _engine_for(self, env: E) -> DockerEngine:
        """The engine snapshots are resolved and removed with (opened once)."""
        async with self._engine_lock:
            if self._engine is None:
                self._engine, self._owns_engine = await self._open_engine(env)
            return self._engine

    # -- the protocol ---------------------------------------------------------------------

    async def _lead(self, env: E, state: State, key: SnapshotKey, started: float) -> State:
        """Replay in ``env``, then commit it (or decide on a fallback) for the waiting others."""
        entry: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
        self._entries[key] = entry
        try:
            self._count(replays=1)
            current = await self._replay(env, state)
            outcome = await self._snapshot(env, key, current)
        except BaseException as exc:
            del self._entries[key]
            reason = f"the replay that would have been forked failed: {type(exc).__name__}: {exc}"
            entry.set_exception(RestoreError(reason))
            entry.exception()  # retrieved: a failure with nobody waiting is not an error
            raise
        entry.set_result(outcome)
        if isinstance(outcome, _Fallback):
            self._count(fallbacks=1)
            record = {"method": "replay", "fallback_reason": outcome.reason}
        elif isinstance(outcome, _Checkpointed):
            record = {"method": "replay", "checkpoint": outcome.checkpoint.name}
        else:
            record = {"method": "replay", "snapshot": outcome.image}
        return self._reanchor(env, state, started, {"restore": record})

    async def _snapshot(self, env: E, key: SnapshotKey, current: State) -> _Outcome:
        if self.process_fork is not None:  # the whole box (it stops; env resumes a copy)
            if self._closed:
                raise RestoreError(f"the {type(self).__name__} was closed during the replay")
            name = f"{key.digest[:16]}-{self.session_id}"
            labels = snapshot_labels(self.session_id, key.image)
            checkpoint = await self.process_fork.checkpoint(env, current, name, labels)
            self._count(snapshots=1)
            return _Checkpointed(checkpoint=checkpoint, template=current)
        shell, container = env.shell, env.container
        assert shell is not None and container is not None
        if "commit" not in container.capabilities:
            return _Fallback(
                reason=f"{type(container).__name__} boxes are not committed (on gVisor: "
                "fork with processes=True)"
            )
        try:
            running = _leftover_processes(await run_probe(shell, _PROCESSES, "listing processes"))
            saved = await capture_shell_state(shell)
        except RestoreError as exc:
            return _Fallback(reason=str(exc))
        if running:
            return _Fallback(
                reason="the prefix left processes running, which a commit does not keep: "
                + ", ".join(running)
            )
        if isinstance(saved, str):
            return _Fallback(reason=saved)
        repo = f"{SNAPSHOT_REPO}/{tag_slug(key.task.rpartition('/')[2])}"
        tag = f"{key.digest[:16]}-{self.session_id}"
        ref = f"{repo}:{tag}"
        if self._closed:
            return _Fallback(reason="the SnapshotRestore was closed during the replay")
        self._images[ref] = ref  # before committing: aclose removes it whatever happens
        register_snapshot_backstop((await self._engine_for(env)).url)
        labels = snapshot_labels(self.session_id, key.image)
        try:
            commit = container.commit(repo, tag, labels=labels)
            self._images[ref] = await shielded(commit, within=self.timeout)
        except (LlenvsError, TimeoutError) as exc:
            return _Fallback(reason=f"committing the replayed container failed: {exc}")
        self._count(snapshots=1)
        return _Snapshot(image=ref, template=current, shell=saved)

    async def _fork(self, env: E, state: State, snap: _Snapshot | _Checkpointed,
                    started: float) -> State:  # fmt: skip
        template = replace(snap.template, task=state.task, actions=state.actions, seed=state.seed)
        if isinstance(snap, _Checkpointed):
            assert self.process_fork is not None  # only a process fork makes checkpoints
            began = time.monotonic()
            await self.process_fork.resume(env, snap.checkpoint, template)
            self._count(forks=1)
            record = {"method": "checkpoint", "checkpoint": snap.checkpoint.name,
                      "resume_sec": round(time.monotonic() - began, 6)}  # fmt: skip
            return self._reanchor(env, state, started, {"restore": record})
        await env.resume(CommittedImage(image=snap.image), template)
        if env.shell is None:
            raise EnvError(f"the forked {type(env).__name__} has no shell")
        await apply_shell_state(env.shell, snap.shell)
        self._count(forks=1)
        record = {"method": "snapshot", "image": snap.image}
        return self._reanchor(env, state, started, {"restore": record})

    async def _fallback(self, env: E, state: State, started: float, reason: str) -> State:
        self._count(replays=1)
        await self._replay(env, state)
        self._count(fallbacks=1)
        record = {"method": "replay", "fallback_reason": reason}
        return self._reanchor(env, state, started, {"restore": record})

    def _count(self, **more: int) -> None:
        now = self._stats
        self._stats = replace(now, **{k: getattr(now, k) + v for k, v in more.items()})
