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

With ``processes=True`` (gVisor sandboxes only: ``runtime="gvisor"``) the first instance
replays the prefix and checkpoints its whole sandbox instead of committing; every
instance, that one included, continues in a sandbox restored from the checkpoint, with
processes, memory, filesystem and the shell's full state intact (``{"method":
"checkpoint", "checkpoint": name}``). Without gVisor that is a ``RestoreError``, never
a silent filesystem-only fork.

Each restored state records how in ``state.info["restore"]``: ``{"method":
"snapshot", "image": ref}`` for a forked instance, ``{"method": "replay",
"snapshot": ref}`` for the instance that replayed and committed, and ``{"method":
"replay", "fallback_reason": why}`` for a replay instead of a fork.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._resource import AsyncResource
from .._shield import shielded
from ..env import Environment
from ..errors import ClosedError, ContainerError, EnvError, LlenvsError, RestoreError
from ..types import Action, State
from .container import Container
from .engine import DockerEngine
from .images import tag_slug
from .ownership import new_session_id
from .shell import ShellSession
from .snapshots import register_snapshot_backstop, remove_image, snapshot_labels

if TYPE_CHECKING:
    from ..sandbox.fork import SandboxCheckpoint
    from ..sandbox.sandbox import Sandbox

__all__ = [
    "SNAPSHOT_REPO",
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
_PROBE_TIMEOUT = 30.0
_SEPARATOR = "__llenvs_shell_state__"
# Per-container or owned by our ShellSession: never carried from the replayed shell.
_NOT_CARRIED = frozenset({"HOSTNAME", "PS1", "PS2"})
_CAPTURE = (
    f"pwd; echo {_SEPARATOR}; umask; echo {_SEPARATOR}; (unset {' '.join(sorted(_NOT_CARRIED))}; "
    "export -p)"
)
_EXPORT_RE = re.compile(r"^(?:declare -\S+|export) ([A-Za-z_][A-Za-z0-9_]*)(?:=|$)", re.M)
_UMASK_RE = re.compile(r"^[0-7]{1,4}$")
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellState:
    """What a commit does not keep of the replayed shell and forks re-apply."""

    cwd: str
    umask: str
    exports: str

    @property
    def exported(self) -> frozenset[str]:
        return frozenset(_EXPORT_RE.findall(self.exports))


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
    checkpoint: SandboxCheckpoint
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


async def _run(shell: ShellSession, command: str, what: str) -> str:
    result = await shell.run(command, timeout=_PROBE_TIMEOUT)
    if not result.ok or result.truncated_bytes:
        raise RestoreError(f"{what} failed (exit code {result.exit_code}): {result.output[:300]!r}")
    return result.output


async def capture_shell_state(shell: ShellSession) -> ShellState | str:
    """The replayed shell's cwd, umask and exports, or why they cannot be carried over."""
    parts = (await _run(shell, _CAPTURE, "capturing the shell state")).split(f"\n{_SEPARATOR}\n")
    if len(parts) != 3 or not _UMASK_RE.match(parts[1]):
        return f"the shell state could not be parsed: {parts[:2]!r}"
    return ShellState(cwd=parts[0], umask=parts[1], exports=parts[2].rstrip("\n"))


async def apply_shell_state(shell: ShellSession, saved: ShellState) -> None:
    """Re-apply ``saved`` in a fresh shell: cwd, umask, and exactly the saved exports."""
    fresh = await _run(
        shell, f"cd -- {shlex.quote(saved.cwd)} && umask {saved.umask} && export -p", "cd/umask"
    )
    extra = sorted(frozenset(_EXPORT_RE.findall(fresh)) - saved.exported - _NOT_CARRIED)
    unset = f"unset -v {' '.join(extra)}\n" if extra else ""
    await _run(shell, unset + saved.exports, "re-applying the exported variables")


class Forkable(Protocol):
    """What ``SnapshotFork`` needs of an environment: its live shell and container, and a
    way to continue a state in a new container started from an image."""

    @property
    def shell(self) -> ShellSession | None: ...

    @property
    def container(self) -> Container | Sandbox | None: ...

    async def resume_from_image(self, image: str, state: State) -> State: ...

    async def resume_from_checkpoint(
        self, checkpoint: SandboxCheckpoint, state: State
    ) -> State: ...


E = TypeVar("E", bound=Forkable)


class SnapshotFork(AsyncResource, Generic[E]):
    """A ``RestoreFn``: replay each distinct state once, fork the rest (see the module doc).

    Subclasses give ``_check`` (the environment as ``E``, or an error), ``_key``,
    ``_replay`` (reset + replay the prefix) and ``_reanchor`` (the restored state, with
    ``info`` merged). ``engine`` (owned by the caller) removes snapshots; by default the
    subclass's ``_open_engine`` gives one. ``timeout`` bounds a commit, and the removal.
    """

    def __init__(
        self, *, engine: DockerEngine | None = None, timeout: float = 120.0, processes: bool = False
    ) -> None:
        self.session_id = new_session_id()
        self.timeout = timeout
        self.processes = processes
        self._checkpoints: list[Path] = []  # checkpoint images (removed by aclose)
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
        runtime = getattr(forkable, "container_runtime", "runc")
        if self.processes and runtime != "gvisor":
            raise RestoreError(
                f"{type(self).__name__}(processes=True) forks whole sandboxes and needs the "
                f"gVisor runtime (HarborAdapter(runtime='gvisor'), --runtime gvisor); "
                f"this {type(env).__name__} runs on {runtime!r}",
                runtime=runtime,
            )
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
        checkpoints, self._checkpoints = self._checkpoints, []
        for directory in checkpoints:
            await shielded(asyncio.to_thread(shutil.rmtree, directory, True), within=self.timeout)
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
            record = {"method": "replay", "checkpoint": outcome.checkpoint.directory.name}
        else:
            record = {"method": "replay", "snapshot": outcome.image}
        return self._reanchor(env, state, started, {"restore": record})

    async def _snapshot(self, env: E, key: SnapshotKey, current: State) -> _Outcome:
        if self.processes:
            return await self._checkpoint(env, key, current)
        shell, container = env.shell, env.container
        assert shell is not None and container is not None
        if not isinstance(container, Container):
            return _Fallback(reason="a gVisor sandbox is forked with processes=True, not committed")
        try:
            running = _leftover_processes(await _run(shell, _PROCESSES, "listing processes"))
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
        register_snapshot_backstop(container.engine.url)
        labels = snapshot_labels(self.session_id, key.image)
        try:
            commit = container.commit(repo, tag, labels=labels)
            self._images[ref] = await shielded(commit, within=self.timeout)
        except (LlenvsError, TimeoutError) as exc:
            return _Fallback(reason=f"committing the replayed container failed: {exc}")
        self._count(snapshots=1)
        return _Snapshot(image=ref, template=current, shell=saved)

    async def _checkpoint(self, env: E, key: SnapshotKey, current: State) -> _Outcome:
        """Checkpoint the replayed sandbox (it stops) and continue ``env`` in a restore."""
        from ..sandbox.fork import checkpoint_sandbox
        from ..sandbox.sandbox import Sandbox

        shell, sandbox = env.shell, env.container
        if shell is None or not isinstance(sandbox, Sandbox):
            raise RestoreError("processes=True needs an environment running in a gVisor sandbox")
        if self._closed:
            raise RestoreError(f"the {type(self).__name__} was closed during the replay")
        labels = {**snapshot_labels(self.session_id, key.image), **sandbox.config["annotations"]}
        name = f"{key.digest[:16]}-{self.session_id}"
        try:
            checkpoint = await shielded(
                checkpoint_sandbox(sandbox, shell, name, labels), within=self.timeout
            )
        finally:
            self._checkpoints.extend(self._pending_checkpoint(sandbox, name))
        self._count(snapshots=1)
        async with asyncio.TaskGroup() as tg:  # the stopped sandbox goes while env resumes
            tg.create_task(sandbox.delete_stopped())
            tg.create_task(env.resume_from_checkpoint(checkpoint, current))
        return _Checkpointed(checkpoint=checkpoint, template=current)

    def _pending_checkpoint(self, sandbox: Sandbox, name: str) -> list[Path]:
        """The checkpoint directory, if made (``aclose`` removes it whatever happened)."""
        directory = sandbox.runsc.checkpoints / name
        return [directory] if directory.exists() else []

    async def _fork(self, env: E, state: State, snap: _Snapshot | _Checkpointed,
                    started: float) -> State:  # fmt: skip
        template = replace(snap.template, task=state.task, actions=state.actions, seed=state.seed)
        if isinstance(snap, _Checkpointed):
            began = time.monotonic()
            await env.resume_from_checkpoint(snap.checkpoint, template)
            self._count(forks=1)
            record = {"method": "checkpoint", "checkpoint": snap.checkpoint.directory.name,
                      "resume_sec": round(time.monotonic() - began, 6)}  # fmt: skip
            return self._reanchor(env, state, started, {"restore": record})
        await env.resume_from_image(snap.image, template)
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
