"""`ShellSession`: one persistent interactive shell per container, driven over exec stdin.

Two channels keep the framework out of observations. A command runs as
``{ CMD } </dev/null >&F 2>&1 F>&-``, fd F being the exec's stdout (the data channel),
followed by a sentinel line printing its sequence number and ``$?`` to F. The shell's own
fds 1 and 2 are the exec's stderr: prompts, ``PROMPT_COMMAND``, ``set -v``/``set -x``
lines of the framing, job notices and traps firing outside the command land there and are
dropped. The group's redirections are undone after it, so ``exec >file`` lasts for that
command and cannot swallow the sentinel; ``$?`` is restored without tripping ``set -e``.

PS2 is a marker carrying the number of the sentinel that last set it, expanded when the
prompt is printed (a late prompt is never counted for the next command, and the echoed or
traced text of the assignment never looks like a prompt). A single line is sent as
``{ CMD; }`` on one line: any prompt means the shell waits for more input. A longer
command goes between ``{`` and ``}`` lines: L lines print L+1 prompts, L+2 means waiting.
An unfinished block instead hits a syntax error (at our ``}`` or ``;``); ``sh -n`` then
tells incomplete from invalid (run first for shells that drop their input on errors: dash).

``ShellWire`` (``shell_wire.py``) launches the shell and speaks this framing; ``ShellSession``
adds what a result means: syntax errors, continuations, timeouts, restarts and adoption.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from .._resource import AsyncResource
from .._shield import shielded
from ..errors import ClosedError, ContainerError, LlenvsError
from ._output import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, CommandResult
from ._shell_channel import ShellChannel, ShellHost, ShellKind, ShellSnapshot
from ._shell_framing import SYNTAX_ERROR, Pending, is_brace_error, is_incomplete, one_line
from ._shell_wire import LAUNCH, PROBE_LIMIT, ContinuationPrompt, ShellExited, ShellWire

__all__ = ["ShellChannel", "ShellHost", "ShellKind", "ShellSession", "ShellSnapshot"]

# bash -i without a terminal complains when a foreground child dies of a signal; after
# output with no final newline (``yes | head -c 3``) the complaint starts mid-line.
_TTY_NOISE = re.compile(r"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n?")
# bash -i announces each background job ("[1] 18") on the stderr the command has.
_JOB_NOTICE = re.compile(r"^\[\d+\] \d+\n", re.M)
_ERREXIT = re.compile(r"\bset\s+(-[a-zA-Z]*e|-o\s+errexit)")
# A shell's report of a syntax error (bash, dash and ash wordings), not an echoed line.
_SYNTAX_LINE = re.compile(r"^[^\s:]+: (?:line )?(?:\d+: )?syntax error", re.I)

_log = logging.getLogger("llenvs_async.shell")


class ShellSession(ShellWire, AsyncResource):
    """One persistent shell in a container (bash if present, else ``sh``, e.g. busybox);
    cwd, variables and functions persist between (serialized) ``run`` calls.
    """

    def __init__(
        self,
        container: ShellHost,
        *,
        shell: ShellKind,
        max_output_bytes: int,
        grace_s: float,
        token: str | None = None,
    ) -> None:
        super().__init__(container, shell=shell, token=token)
        self.max_output_bytes = max_output_bytes
        self.grace_s = grace_s
        self._lock = asyncio.Lock()
        self._unsettled_since: float | None = None
        self._closed = False

    @classmethod
    async def start(
        cls,
        container: ShellHost,
        *,
        shell: ShellKind = "auto",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        grace_s: float = 2.0,
    ) -> ShellSession:
        """Start the shell and wait until it answers.

        ``grace_s``: how long an interrupted command gets to end before it is killed.
        """
        if shell not in LAUNCH:
            raise ValueError(f"shell must be one of {sorted(LAUNCH)}, got {shell!r}")
        session = cls(container, shell=shell, max_output_bytes=max_output_bytes, grace_s=grace_s)
        await session._launch()
        return session

    @classmethod
    def adopt(cls, host: ShellHost, snap: ShellSnapshot, channel: ShellChannel) -> ShellSession:
        """A session driving the shell ``snap`` describes, still running in ``host`` (a
        restored checkpoint), over a new ``channel`` to it: no new shell, state intact."""
        session = cls(
            host,
            shell=snap.requested_shell,
            max_output_bytes=snap.max_output_bytes,
            grace_s=snap.grace_s,
            token=snap.token,
        )
        session.kind, session.pid, session._fd, session._seq = (
            snap.kind,
            snap.pid,
            snap.fd,
            snap.seq,
        )
        session._prompt_seq, session._flags, session._mark = snap.prompt_seq, snap.flags, snap.mark
        session._check_syntax_first, session._parser = snap.check_syntax_first, snap.parser
        session._promptvars = "\\shopt -s promptvars; " if snap.kind == "bash" else ""
        session._stream = channel
        return session

    def snapshot(self) -> ShellSnapshot:
        """This session's view of its shell (between commands), for ``adopt``."""
        if self._unsettled_since is not None or self._stream is None or self._lock.locked():
            raise ContainerError("the shell is busy: snapshot it between commands")
        return ShellSnapshot(
            token=self._token,
            requested_shell=self.requested_shell,
            kind=self.kind,
            pid=self.pid,
            fd=self._fd,
            seq=self._seq,
            prompt_seq=self._prompt_seq,
            flags=self._flags,
            mark=self._mark,
            check_syntax_first=self._check_syntax_first,
            parser=self._parser,
            max_output_bytes=self.max_output_bytes,
            grace_s=self.grace_s,
        )

    @property
    def channel(self) -> ShellChannel | None:
        """The channel to the shell now (``None`` while it is being replaced)."""
        return self._stream

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - on timeout the command is interrupted
        stop: Callable[[], Awaitable[str]] | None = None,
    ) -> CommandResult:
        """Run shell text (may span lines); past ``timeout`` interrupt it (SIGINT, then
        SIGKILL to what it started, then a fresh shell). Never raises for the command's sake.
        ``stop``: a watch run alongside the command; when it returns (a reason) the command
        is interrupted the same way and the result's ``stopped`` says why.
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
                incomplete = is_incomplete(errors)
                return CommandResult(
                    output="" if incomplete else errors,
                    exit_code=2,
                    continuation_prompt=incomplete,
                    duration_s=time.monotonic() - started,
                    shell_restarted=restarted,
                )
            errexit = "e" in self._flags
            p = await self._execute(body, timeout, self.max_output_bytes, stop=stop)
            output = self._clean(p.out, background="&" in body)
            if p.rc == 2 and not p.continuation and not p.exited:
                output, p.continuation = await self._parse_failure(body, output, p)
            if p.exited and not p.timed_out:
                output += self._exit_note(p.rc, errexit or bool(_ERREXIT.search(body)), output)
            return CommandResult(
                output=output,
                exit_code=p.rc,
                timed_out=p.timed_out,
                stopped=p.stopped,
                continuation_prompt=p.continuation,
                truncated_bytes=p.out.truncated_bytes,
                duration_s=time.monotonic() - started,
                shell_restarted=restarted or p.restarted,
            )

    def _clean(self, out: CappedOutput, *, background: bool) -> str:
        """The command's output without what bash -i adds for itself on its stderr."""
        text = out.text()
        if self.kind != "bash":
            return text
        if background:
            text = _JOB_NOTICE.sub("", text)
        return _TTY_NOISE.sub("", text)

    async def _parse_failure(self, body: str, output: str, p: Pending) -> tuple[str, bool]:
        """Exit code 2 after a syntax error: the command's own errors (printed on the shell's
        channel) join its output, or, if it is merely unfinished, a continuation. Without
        the end mark that channel is not known to be complete: the parser then decides."""
        lines = p.noise.text().split("\n")
        if p.one_line:  # the whole line was refused: no ``}`` error of ours
            errors = [line for line in lines if _SYNTAX_LINE.match(line)]
            if not errors:
                return await self._unmarked_failure(body, output, p)
            if is_incomplete(await self._syntax_errors(body)):
                return "", True
            return output + "".join(f"{line}\n" for line in errors), False
        ours = [i for i, line in enumerate(lines) if is_brace_error(line)]
        if not ours:
            return await self._unmarked_failure(body, output, p)
        framing = f"}} </dev/null >&{self._fd} 2>&1 {self._fd}>&-"
        before = [ln for ln in lines[: ours[-1]] if ln.strip() and ln != framing]
        if any(SYNTAX_ERROR in line.lower() for line in before):
            return output + "".join(f"{line}\n" for line in before), False
        if is_incomplete(await self._syntax_errors(body)):
            return "", True
        return output, False

    async def _unmarked_failure(self, body: str, output: str, p: Pending) -> tuple[str, bool]:
        """Exit code 2 and no syntax error read: a plain failure when the end mark proves
        the shell's channel was read in full; else what ``sh -n`` says of the command."""
        if p.marked:
            return output, False
        errors = await self._syntax_errors(body)
        if not errors:
            return output, False
        if is_incomplete(errors):
            return "", True
        return output + errors + "\n", False

    @staticmethod
    def _exit_note(code: int | None, errexit: bool, output: str) -> str:
        """Says why the shell is gone: the observation must explain the restart."""
        status = "" if code is None else f" with status {code}"
        why = ": `set -e` was on and a command failed" if errexit and code else ""
        lead = "\n" if output and not output.endswith("\n") else ""
        return f"{lead}[the shell exited{status}{why}; a new shell was started]\n"

    async def _execute(
        self,
        body: str,
        seconds: float | None,
        max_bytes: int,
        *,
        stderr: str = "&1",
        stop: Callable[[], Awaitable[str]] | None = None,
    ) -> Pending:
        """Send one command, wrapped in a group and followed by the sentinel line; read it.

        ``stderr``: where the group's stderr goes (a probe sends the shell's ``set -x``
        lines to ``/dev/null``).
        """
        started = time.monotonic()
        seq = self._next_seq()
        p = self._pending(seq, max_bytes)
        fd = self._fd
        if one_line(body):  # the common case: no prompt, nothing on the shell's channel
            group = f"{{ {body}; }}"
            p.ps2_limit, p.one_line = 1, True
        else:  # an L-line body is read after L+1 prompts
            group = f"{{\n{body}\n}}"
            p.ps2_limit = body.count("\n") + 3
        self._unsettled_since = started
        try:
            await self._write(
                f"{group} </dev/null >&{fd} 2>{stderr} {fd}>&-\n".encode()
                + self._sentinel_line(seq)
            )
            async with asyncio.timeout(seconds) as deadline:
                await _watched(self._pump(p), stop, deadline, p)
        except TimeoutError:
            if not p.done:  # else it ended in time, its end mark did not: see _parse_failure
                p.timed_out = p.stopped is None
                p.restarted = await self._settle(p, started)
        except ContinuationPrompt:
            p.continuation = True
            p.restarted = await self._settle(p, started)
        except ShellExited:
            p.rc = await self._exit_code()
            p.restarted = p.exited = True
            await self._restart()
        self._unsettled_since = None
        return p

    async def _syntax_errors(self, body: str) -> str:
        """What the shell's parser (``-n``: parse only) says about ``body``; empty if valid."""
        delimiter = f"__llenvs_eof_{secrets.token_hex(6)}"
        probe = f"LC_ALL=C {self._parser} -n 2>&1 <<'{delimiter}' || \\:\n{body}\n{delimiter}"
        p = await self._execute(probe, 10.0, PROBE_LIMIT, stderr="/dev/null")
        return p.out.text().strip()

    async def _settle(self, p: Pending, since: float) -> bool:
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
        except ShellExited:
            pass
        await self._restart()
        return True

    async def _pump_for(self, p: Pending, seconds: float) -> bool:
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
        return await self._settle(self._pending(-1, PROBE_LIMIT), since)

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


async def _watched(
    work: Awaitable[None],
    stop: Callable[[], Awaitable[str]] | None,
    deadline: asyncio.Timeout,
    p: Pending,
) -> None:
    """``work`` with ``stop`` watching: when the watch returns first, its reason goes on
    ``p`` and ``deadline`` expires now (the command is interrupted as on a timeout). The
    watch ends with the work; an error of its own is logged and stops nothing."""
    if stop is None:
        await work
        return

    async def watch() -> None:
        p.stopped = await stop()
        deadline.reschedule(asyncio.get_running_loop().time())

    watcher = asyncio.ensure_future(watch())
    try:
        await work
    finally:
        watcher.cancel()
        await asyncio.wait([watcher])
        if not watcher.cancelled() and (error := watcher.exception()) is not None:
            _log.warning("a command's watch failed (the command ran on): %r", error)
