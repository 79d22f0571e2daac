"""Finding and calling gVisor's ``runsc`` (one state root per machine, shared by processes).

We drive ``runsc`` directly on OCI bundles rather than through Docker: Docker can run
runsc as a runtime and ``docker checkpoint`` works with it, but only after reconfiguring
and restarting the daemon (``daemon.json`` runtimes + experimental), and dockerd 20.10
refuses ``--checkpoint-dir`` ("custom checkpointdir is not supported"), so N containers
forked from one checkpoint would need files copied into dockerd's private data root.
Directly, one checkpoint image restores into any number of sandboxes.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .._shield import shielded
from ..errors import ContainerError, GvisorUnavailableError

__all__ = ["ROOT_ENV", "RUNSC_ENV", "Runsc", "find_runsc"]

RUNSC_ENV = "LLENVS_RUNSC"
"""Path of the ``runsc`` binary (default: ``runsc`` on ``PATH``)."""
ROOT_ENV = "LLENVS_GVISOR_ROOT"
"""Directory for runsc's state, bundles and checkpoints (default ``/run/llenvs-gvisor``)."""
PLATFORM_ENV = "LLENVS_GVISOR_PLATFORM"
"""gVisor platform: ``ptrace`` (default, works anywhere) or ``kvm`` (needs ``/dev/kvm``)."""
_DEFAULT_ROOT = "/run/llenvs-gvisor"
_INSTALL_HINT = "run scripts/ensure-gvisor.sh (make gvisor), or set LLENVS_RUNSC"
_GO_CRASH = re.compile(r"^(?:panic|fatal error): .*$", re.M)


def failure_text(stderr: bytes, limit: int = 500) -> str:
    """What a failed runsc said, cut to ``limit`` characters from its end, with a Go crash's
    first line kept: a panic's cause comes first and its goroutine stacks after it."""
    text = stderr.decode(errors="replace").strip()
    tail = text[-limit:]
    crash = _GO_CRASH.search(text)
    if crash is None or crash.group(0) in tail:
        return tail
    return f"{crash.group(0)[:limit]} [...] {tail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Runsc:
    """A ``runsc`` binary and the state root every sandbox of this machine shares."""

    binary: str
    root: Path
    platform: str = "ptrace"

    @property
    def state_dir(self) -> Path:
        """runsc's own ``--root`` (its container state files)."""
        return self.root / "state"

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def argv(self, *args: str, sandbox: bool = False) -> list[str]:
        """A runsc command line; ``sandbox``: the flags a new sandbox runs with (no network,
        filesystem writes kept in sandbox memory so they travel with a checkpoint)."""
        flags = [f"--platform={self.platform}", "--network=none", "--overlay2=root:memory"]
        return [self.binary, f"--root={self.state_dir}", *(flags if sandbox else []), *args]

    async def call(
        self,
        *args: str,
        sandbox: bool = False,
        timeout: float = 60.0,  # noqa: ASYNC109 - the subprocess is killed past it
        what: str = "",
        log: Path | None = None,
    ) -> str:
        """Run one runsc command to its end; its stdout, or ``ContainerError`` with stderr.

        ``log``: a file for stderr instead of a pipe, stdout going nowhere (``run`` and
        ``restore -detach``: the sandbox inherits them and would hold a pipe open).
        """
        sink = log.open("wb") if log is not None else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(*args, sandbox=sandbox),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if sink is None else subprocess.DEVNULL,
                stderr=subprocess.PIPE if sink is None else sink,
            )
        finally:
            if sink is not None:
                sink.close()
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await shielded(proc.wait(), within=10)
            raise
        if proc.returncode != 0:
            if log is not None:
                err = await asyncio.to_thread(log.read_bytes)
            raise ContainerError(
                f"runsc {what or args[0]} failed (exit {proc.returncode}): {failure_text(err)}"
            )
        return (out or b"").decode(errors="replace")

    def call_sync(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run one runsc command without an event loop (atexit, cleanup); never raises for
        its exit status."""
        return subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=timeout, check=False
        )


def find_runsc(root: str | Path | None = None) -> Runsc:
    """The ``runsc`` to use, or ``GvisorUnavailableError`` naming what is missing."""
    name = os.environ.get(RUNSC_ENV) or "runsc"
    binary = shutil.which(name)
    if binary is None:
        raise GvisorUnavailableError(f"gVisor's runsc is not installed ({name!r} not found): "
                                     f"{_INSTALL_HINT}")  # fmt: skip
    if os.geteuid() != 0:
        raise GvisorUnavailableError(
            f"gVisor sandboxes need root here (runsc {binary} is run without rootless mode); "
            "run as root"
        )
    platform = os.environ.get(PLATFORM_ENV) or "ptrace"
    if platform not in ("ptrace", "kvm"):
        raise GvisorUnavailableError(f"{PLATFORM_ENV}={platform!r}: use 'ptrace' or 'kvm'")
    if platform == "kvm" and not os.path.exists("/dev/kvm"):
        raise GvisorUnavailableError(f"{PLATFORM_ENV}=kvm but /dev/kvm does not exist")
    state = Path(root or os.environ.get(ROOT_ENV) or _DEFAULT_ROOT)
    runsc = Runsc(binary=binary, root=state, platform=platform)
    for directory in (runsc.state_dir, runsc.bundles, runsc.checkpoints):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return runsc
