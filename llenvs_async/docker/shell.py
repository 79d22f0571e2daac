"""`ShellSession`: one persistent interactive shell per container, driven over exec stdin.

A command is sent as ``{ CMD } </dev/null 2>&1`` plus a line printing a sentinel with
``$?`` (stderr joins stdout: one ordered stream). PS2 is a unique marker: a complete
L-line command prints L+1 of them, so L+2 means the shell waits for more input. An
unfinished block instead hits a syntax error at our ``}``; ``sh -n`` then tells
incomplete from invalid (run first for shells that drop their input on errors: dash).
A command can print the marker itself (``echo "$PS2"``): the extra marker counts as a
prompt only when nothing follows it for ``_PS2_QUIET_S`` (a waiting shell prints nothing).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import aiodocker
import aiohttp

from .._resource import AsyncResource
from ..errors import ClosedError, ContainerError, LlenvsError
from ._shield import shielded
from .output import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, CommandResult

if TYPE_CHECKING:
    from aiodocker.execs import Exec
    from aiodocker.stream import Stream

    from .container import Container

__all__ = ["ShellKind", "ShellSession"]

ShellKind = Literal["auto", "bash", "sh"]

_BASH = "exec bash --noprofile --norc --noediting -i"
_LAUNCH: dict[str, str] = {
    "auto": f"exec 2>&1; if command -v bash >/dev/null 2>&1; then {_BASH}; fi; exec /bin/sh -i",
    "bash": f"exec 2>&1; {_BASH}",
    "sh": "exec 2>&1; exec /bin/sh -i",
}
_PROBE_LIMIT = 4096
_PS2_QUIET_S = 0.3  # how long a would-be continuation prompt must stay the last output
_SYNTAX_ERROR = "syntax error"
# bash -i without a terminal complains when a foreground child dies of a signal.
_TTY_NOISE = re.compile(r"^bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl.*\n?", re.M)
_DATA, _PS2, _SENTINEL = 0, 1, 2


def _is_brace_error(line: str) -> bool:
    """A shell's syntax error about an unexpected ``}`` (bash and ash wordings)."""
    return _SYNTAX_ERROR in line.lower() and ("`}'" in line or '"}"' in line)


def _incomplete(parse_errors: str) -> bool:
    """Whether a parser's complaint means "input ended too early" rather than "invalid"."""
    text = parse_errors.lower()
    return any(sign in text for sign in ("end of file", "unexpected eof", "unterminated"))


class _ContinuationPrompt(Exception):
    """The shell printed one PS2 marker more than a complete command produces."""


class _ShellExited(Exception):
    """The shell's exec stream ended (``exit``, killed, container gone)."""


class _Scanner:
    """Splits the output stream into data, PS2 markers and sentinel lines, across chunks."""

    __slots__ = ("_keep", "_marker", "_pending", "_tag")

    def __init__(self, marker: bytes, tag: bytes) -> None:
        self._marker, self._tag = marker, tag
        self._keep = max(len(marker), len(tag)) - 1
        self._pending = b""

    @property
    def holds_bytes(self) -> bool:
        """Whether bytes were received that are not yet returned as events."""
        return bool(self._pending)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._pending + data if self._pending else data
        events: list[tuple[int, bytes]] = []
        pos, end = 0, len(buf)
        while True:
            m = buf.find(self._marker, pos)
            t = buf.find(self._tag, pos)
            if m >= 0 and (t < 0 or m < t):
                if m > pos:
                    events.append((_DATA, buf[pos:m]))
                events.append((_PS2, b""))
                pos = m + len(self._marker)
            elif t >= 0:
                newline = buf.find(b"\n", t)
                if newline < 0:
                    end = t
                    break
                if t > pos:
                    events.append((_DATA, buf[pos:t]))
                events.append((_SENTINEL, buf[t + len(self._tag) : newline]))
                pos = newline + 1
            else:
                end = self._partial_start(buf, max(pos, len(buf) - self._keep))
                break
        if end > pos:
            events.append((_DATA, buf[pos:end]))
        self._pending = buf[end:]
        return events

    def _partial_start(self, buf: bytes, start: int) -> int:
        """Where a suffix of ``buf`` that may begin a marker or tag starts (else its end)."""
        for i in range(start, len(buf)):
            tail = buf[i:]
            if self._marker.startswith(tail) or self._tag.startswith(tail):
                return i
        return len(buf)


@dataclass(slots=True, kw_only=True)
class _Pending:
    """What has been read for the command in flight (a mutable accumulator).

    ``cmd_seq`` numbers the command's own sentinel, ``target`` the one that ends the wait
    (the same, or a resync sentinel sent after an interrupt).
    """

    cmd_seq: int
    target: int
    out: CappedOutput
    ps2_limit: int | None = None
    ps2: int = 0
    rc: int | None = None
    payload: str = ""
    done: bool = False
    timed_out: bool = False
    continuation: bool = False
    restarted: bool = False

    def on_sentinel(self, payload: str) -> None:
        seq, _, rest = payload.partition(":")
        if not seq.isdigit():
            return
        if int(seq) == self.cmd_seq and rest.isdigit():
            self.rc = int(rest)
        if int(seq) == self.target:
            self.done = True
            self.payload = rest
            if self.rc is None and rest.isdigit():
                self.rc = int(rest)


class ShellSession(AsyncResource):
    """One persistent shell in a container (bash if present, else ``sh``, e.g. busybox);
    cwd, variables and functions persist between (serialized) ``run`` calls.
    """

    def __init__(
        self, container: Container, *, shell: ShellKind, max_output_bytes: int, grace_s: float
    ) -> None:
        token = secrets.token_hex(8)
        self.container = container
        self.requested_shell: ShellKind = shell
        self.kind = ""
        self.pid = 0
        self.max_output_bytes = max_output_bytes
        self.grace_s = grace_s
        self.start_timeout_s = 30.0
        self._marker = f"__llps2_{token}__"
        self._tag = f"__llend_{token}_"
        self._scanner = _Scanner(self._marker.encode(), self._tag.encode())
        self._seq = 0
        self._exec: Exec | None = None
        self._stream: Stream | None = None
        self._lock = asyncio.Lock()
        self._unsettled_since: float | None = None
        self._check_syntax_first = False
        self._closed = False

    @classmethod
    async def start(
        cls,
        container: Container,
        *,
        shell: ShellKind = "auto",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        grace_s: float = 2.0,
    ) -> ShellSession:
        """Start the shell and wait until it answers.

        ``grace_s``: how long an interrupted command gets to end before it is killed.
        """
        if shell not in _LAUNCH:
            raise ValueError(f"shell must be one of {sorted(_LAUNCH)}, got {shell!r}")
        session = cls(container, shell=shell, max_output_bytes=max_output_bytes, grace_s=grace_s)
        await session._launch()
        return session

    @property
    def closed(self) -> bool:
        return self._closed

    async def _launch(self) -> None:
        self._exec, self._stream = await self.container.open_exec(
            ["/bin/sh", "-c", _LAUNCH[self.requested_shell]], stdin=True
        )
        self._scanner = _Scanner(self._marker.encode(), self._tag.encode())
        seq = self._next_seq()
        init = (
            f"PS1=''; PS2='{self._marker}'; unset HISTFILE; "
            '[ -n "$BASH_VERSION" ] && set +H +o history; '
            "__llenvs_rc() { return $1; }; "
            f"command printf '{self._tag}{seq}:%d:%s:%s\\n' $$ \"${{BASH_VERSION:+bash}}\" "
            '"$(readlink /proc/$$/exe 2>/dev/null)"\n'
        )
        pending = _Pending(cmd_seq=seq, target=seq, out=CappedOutput(_PROBE_LIMIT))
        try:
            await self._write(init.encode())
            async with asyncio.timeout(self.start_timeout_s):
                await self._pump(pending)
        except (TimeoutError, _ShellExited) as exc:
            await self._close_stream()
            raise ContainerError(
                f"the shell did not start in container {self.container.short_id}: "
                f"{pending.out.text().strip()[-300:]!r}",
                container_id=self.container.id,
            ) from exc
        pid, kind, exe = [*pending.payload.split(":", 2), "", ""][:3]
        self.pid = int(pid)
        self.kind = kind or "sh"
        # bash and busybox ash keep reading after a syntax error; others (dash) drop the
        # rest of their input, our sentinel included: check those commands' syntax first.
        self._check_syntax_first = self.kind != "bash" and not exe.endswith("busybox")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _sentinel_line(self, seq: int) -> bytes:
        """Prints the tag, ``seq`` and ``$?``, then restores ``$?`` for the next command."""
        return (
            f"__llenvs_rc=$?; command printf '{self._tag}{seq}:%d\\n' $__llenvs_rc; "
            "__llenvs_rc $__llenvs_rc\n"
        ).encode()

    async def _write(self, data: bytes) -> None:
        if self._stream is None:
            raise _ShellExited
        try:
            await self._stream.write_in(data)
        except (OSError, RuntimeError, AssertionError, aiohttp.ClientError) as exc:
            raise _ShellExited from exc

    async def _pump(self, p: _Pending) -> None:
        """Read until the sentinel of ``p.target`` arrives."""
        assert self._stream is not None
        extra = 0  # markers past a complete command's count with nothing after them yet
        while not p.done:
            try:
                quiet_s = _PS2_QUIET_S if extra and not self._scanner.holds_bytes else None
                async with asyncio.timeout(quiet_s) as quiet:
                    message = await self._stream.read_out()
            except TimeoutError:
                if quiet.expired():  # a waiting shell: nothing after the prompt
                    raise _ContinuationPrompt from None
                raise
            except (OSError, RuntimeError, aiohttp.ClientError) as exc:
                raise _ShellExited from exc
            if message is None:
                raise _ShellExited
            for kind, payload in self._scanner.feed(message.data):
                if kind == _PS2:
                    if p.ps2_limit is None or p.ps2 + 1 < p.ps2_limit:
                        p.ps2 += 1
                    else:
                        extra += 1
                    continue
                if extra:  # output followed: those markers were printed by the command
                    p.out.feed(self._marker.encode() * extra)
                    extra = 0
                if kind == _DATA:
                    p.out.feed(payload)
                else:
                    p.on_sentinel(payload.decode("ascii", "replace"))

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - on timeout the command is interrupted
    ) -> CommandResult:
        """Run shell text (may span lines); past ``timeout`` interrupt it (SIGINT, then
        SIGKILL to what it started, then a fresh shell). Never raises for the command's sake.
        """
        if self._closed:
            raise ClosedError("ShellSession")
        async with self._lock:
            started = time.monotonic()
            restarted = False
            if self._unsettled_since is not None or self._stream is None:
                restarted = await self._recover()
            body = command.rstrip("\n")
            if not any(ln.strip() and not ln.lstrip().startswith("#") for ln in body.split("\n")):
                return CommandResult(output="", exit_code=0, shell_restarted=restarted)
            if self._check_syntax_first and (errors := await self._syntax_errors(body)):
                incomplete = _incomplete(errors)
                return CommandResult(
                    output="" if incomplete else errors,
                    exit_code=2,
                    continuation_prompt=incomplete,
                    duration_s=time.monotonic() - started,
                    shell_restarted=restarted,
                )
            p = await self._execute(body, timeout, self.max_output_bytes)
            output = _TTY_NOISE.sub("", p.out.text())
            lines = output.rstrip("\n").split("\n")
            if p.rc == 2 and _is_brace_error(lines[-1]):
                if any(_SYNTAX_ERROR in line.lower() for line in lines[:-1]):
                    output = "\n".join(lines[:-1]) + "\n"  # the command's own error, then ours
                elif _incomplete(await self._syntax_errors(body)):
                    output, p.continuation = "", True
            return CommandResult(
                output=output,
                exit_code=p.rc,
                timed_out=p.timed_out,
                continuation_prompt=p.continuation,
                truncated_bytes=p.out.truncated_bytes,
                duration_s=time.monotonic() - started,
                shell_restarted=restarted or p.restarted,
            )

    async def _execute(self, body: str, seconds: float | None, max_bytes: int) -> _Pending:
        """Send one command, wrapped in a group and followed by the sentinel line; read it."""
        started = time.monotonic()
        seq = self._next_seq()
        p = _Pending(
            cmd_seq=seq, target=seq, out=CappedOutput(max_bytes), ps2_limit=body.count("\n") + 3
        )
        self._unsettled_since = started
        try:
            await self._write(
                f"{{\n{body}\n}} </dev/null 2>&1\n".encode() + self._sentinel_line(seq)
            )
            async with asyncio.timeout(seconds):
                await self._pump(p)
        except TimeoutError:
            p.timed_out = True
            p.restarted = await self._settle(p, started)
        except _ContinuationPrompt:
            p.continuation = True
            p.restarted = await self._settle(p, started)
        except _ShellExited:
            p.rc = await self._exit_code()
            p.restarted = True
            await self._restart()
        self._unsettled_since = None
        return p

    async def _syntax_errors(self, body: str) -> str:
        """What the shell's parser (``-n``: parse only) says about ``body``; empty if valid."""
        delimiter = f"__llenvs_eof_{secrets.token_hex(6)}"
        shell = "bash" if self.kind == "bash" else "sh"
        probe = f"LC_ALL=C {shell} -n <<'{delimiter}' || true\n{body}\n{delimiter}"
        return (await self._execute(probe, 10.0, _PROBE_LIMIT)).out.text().strip()

    async def _settle(self, p: _Pending, since: float) -> bool:
        """Interrupt the command in flight and resynchronise; True if the shell was replaced.

        Ctrl-C first (SIGINT to the shell and what the command started), then SIGKILL to
        what the command started, then a fresh shell.
        """
        p.ps2_limit = None
        p.done = False
        p.target = self._next_seq()
        try:
            await self.container.signal_tree(self.pid, "INT", max_age_s=time.monotonic() - since)
            await self._write(self._sentinel_line(p.target))
            if await self._pump_for(p, self.grace_s):
                return False
            age = time.monotonic() - since
            await self.container.signal_tree(self.pid, "KILL", keep_root=True, max_age_s=age)
            if await self._pump_for(p, self.grace_s):
                return False
        except _ShellExited:
            pass
        await self._restart()
        return True

    async def _pump_for(self, p: _Pending, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._pump(p)
        except TimeoutError:
            return False
        return True

    async def _recover(self) -> bool:
        """Bring the shell back after a cancelled ``run`` or a lost stream."""
        since, self._unsettled_since = self._unsettled_since, None
        if self._stream is None or since is None:
            await self._restart()
            return True
        p = _Pending(cmd_seq=-1, target=-1, out=CappedOutput(_PROBE_LIMIT))
        return await self._settle(p, since)

    async def _exit_code(self) -> int | None:
        if self._exec is None:
            return None
        try:
            info = await self._exec.inspect()
        except (aiodocker.DockerError, aiohttp.ClientError, OSError):
            return None
        code = info.get("ExitCode")
        return code if isinstance(code, int) else None

    async def restart(self) -> None:
        """Replace the shell with a fresh one (cwd and variables are lost)."""
        async with self._lock:
            await self._restart()

    async def _restart(self) -> None:
        if self._closed:
            raise ClosedError("ShellSession")
        await self._kill()
        await self._launch()

    async def _kill(self) -> None:
        """Kill the shell and everything it started, and drop the stream."""
        pid, self.pid = self.pid, 0
        try:
            if pid and not self.container.closed:
                await self.container.signal_tree(pid, "KILL")
        except LlenvsError:
            pass  # the container or engine is going away: its processes go with it
        finally:
            await self._close_stream()

    async def _close_stream(self) -> None:
        stream, self._stream, self._exec = self._stream, None, None
        if stream is not None:
            await stream.close()

    async def detach(self) -> None:
        """Drop the stream without touching processes (the container is going away)."""
        self._closed = True
        await self._close_stream()

    async def aclose(self) -> None:
        """Kill the shell and its processes (idempotent; shielded from cancellation)."""
        if self._closed:
            return
        self._closed = True
        await shielded(self._kill(), within=30)
