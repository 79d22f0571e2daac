"""A persistent shell's channel inside a gVisor sandbox: FIFOs in the sandbox, a relay exec.

The shell's stdin, stdout and stderr are FIFOs in the sandbox's memory, opened read-write
(so no reader or writer ever sees an end while the shell lives). A relay (``runsc exec``
of three ``cat``s) copies between the FIFOs and our pipes. A checkpoint cannot hold host
file descriptors, and after a restore none would exist: so the relay is killed before a
checkpoint and a new one attaches to the same FIFOs after each restore; the shell itself
never notices (what it wrote meanwhile waits in the FIFO).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from .._shield import shielded
from ..errors import LlenvsError
from ..host import Host

__all__ = ["FifoChannel", "SHELL_DIR"]

SHELL_DIR = "/run/llenvs-shell"
"""Where each shell's FIFOs live in the sandbox (one directory per shell)."""
# Args: DIR ARGV... Makes the FIFOs, starts ARGV on them in the background; when it exits
# its parent records the status in DIR/rc (a rename: complete once it exists) and ends the
# relay (our streams end: the shell is gone). Nothing of the exec's own stdio is kept.
START_SCRIPT = r"""d=$1; shift
mkdir -p "$d" && mkfifo "$d/in" "$d/out" "$d/err" || exit 1
{ "$@" <>"$d/in" 1<>"$d/out" 2<>"$d/err"; echo $? >"$d/rc.new"; mv "$d/rc.new" "$d/rc"
  kill -9 $(cat "$d/relay" 2>/dev/null) 2>/dev/null; } </dev/null >/dev/null 2>&1 &
"""
# Args: DIR. stdout <- DIR/out, stderr <- DIR/err, stdin -> DIR/in; pids in DIR/relay. A
# shell that exited before the relay recorded its pids could not end it (its FIFOs have no
# writer left, so the cats would wait forever): the relay checks DIR/rc after recording
# them and ends itself.
RELAY_SCRIPT = r"""d=$1
cat "$d/out" 2>/dev/null & echo $! >"$d/relay"
cat "$d/err" >&2 & echo $! >>"$d/relay"
echo $$ >>"$d/relay"
[ -e "$d/rc" ] && kill -9 $(cat "$d/relay")
exec cat >"$d/in" 2>/dev/null
"""
_READ = 65536
# How long after our streams end the shell's parent may take to record its status.
_RELAY_END_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class _Chunk:
    stream: int
    data: bytes


class FifoChannel:
    """A ``ShellChannel`` through a relay exec to a shell's FIFOs in ``directory`` of
    ``sandbox`` (the host its status is read and its relay ended through)."""

    def __init__(self, sandbox: Host, directory: str, proc: asyncio.subprocess.Process) -> None:
        self.sandbox = sandbox
        self.directory = directory
        self._proc = proc
        self._reads: dict[int, asyncio.Task[bytes]] = {}
        self._open = {1: proc.stdout, 2: proc.stderr}

    @classmethod
    async def attach(cls, sandbox: Host, exec_argv: Sequence[str], directory: str) -> FifoChannel:
        """Start a relay to the shell whose FIFOs are in ``directory``; ``exec_argv`` runs a
        command in the sandbox (``runsc exec ID``)."""
        proc = await asyncio.create_subprocess_exec(
            *exec_argv,
            "/bin/sh",
            "-c",
            RELAY_SCRIPT,
            "sh",
            directory,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return cls(sandbox, directory, proc)

    async def write_in(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        stdin.write(data)
        await stdin.drain()

    async def read_out(self) -> _Chunk | None:
        for stream, reader in self._open.items():
            if reader is not None and stream not in self._reads:
                self._reads[stream] = asyncio.ensure_future(reader.read(_READ))
        while self._reads:
            done, _ = await asyncio.wait(self._reads.values(), return_when=asyncio.FIRST_COMPLETED)
            for stream, task in list(self._reads.items()):
                if task in done:
                    del self._reads[stream]
                    if data := task.result():
                        return _Chunk(stream, data)
                    self._open[stream] = None  # end of that stream
        return None

    async def exit_code(self) -> int | None:
        """The shell's exit status, recorded by its parent in the sandbox (if it got to).

        Our streams may end before it is written (the shell's exit closes its FIFOs), but
        the parent writes it before it kills the relay: so wait for the relay to end.
        """
        try:
            async with asyncio.timeout(_RELAY_END_TIMEOUT):
                await self._proc.wait()
        except TimeoutError:
            return None  # the relay lives on: the shell's parent never got to end it
        result = await self.sandbox.exec(["/bin/sh", "-c", f"cat {self.directory}/rc"])
        text = result.output.strip()
        return int(text) if result.ok and text.isdigit() else None

    async def close(self) -> None:
        """End the relay (its processes in the sandbox too: they hold our pipes, donated to
        the sandbox); the shell keeps running. Idempotent."""
        reads, self._reads = list(self._reads.values()), {}
        for task in reads:
            task.cancel()
        proc = self._proc
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        if proc.returncode is None and not self.sandbox.closed:
            kill = ["/bin/sh", "-c", f"kill -9 $(cat {self.directory}/relay) 2>/dev/null"]
            try:
                await shielded(self.sandbox.exec(kill), within=10)
            except (LlenvsError, TimeoutError):
                pass  # the sandbox is going away: the relay goes with it
        if proc.returncode is None:
            proc.kill()
        try:
            await shielded(asyncio.gather(proc.wait(), *reads, return_exceptions=True), within=10)
        except TimeoutError:
            pass  # pipes still held by a sandbox being removed: they close with it
