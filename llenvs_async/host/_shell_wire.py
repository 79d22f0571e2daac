"""`ShellWire`: the framed line protocol to one interactive shell (see ``shell.py``).

It launches the shell, writes command lines followed by sentinel lines, and reads the
two channels until a sentinel and its end mark arrive; what a command's result means
(syntax errors, timeouts, restarts) is ``ShellSession``'s business.
"""

from __future__ import annotations

import asyncio
import secrets

from ..errors import ContainerError
from ._output import CappedOutput
from ._shell_channel import ShellChannel, ShellHost, ShellKind
from ._shell_framing import DATA, Pending, Scanner

__all__ = ["LAUNCH", "PROBE_LIMIT", "ContinuationPrompt", "ShellExited", "ShellWire"]

# The launcher moves the exec's stdout to fd 9 (the data channel) and points the shell's
# own stdout at stderr before the shell starts (busybox prints a banner and a prompt).
_BASH = "exec bash --noprofile --norc --noediting -i"
LAUNCH: dict[str, str] = {
    "auto": f"exec 9>&1 1>&2; if command -v bash >/dev/null 2>&1; then {_BASH}; fi; "
    "exec /bin/sh -i",
    "bash": f"exec 9>&1 1>&2; {_BASH}",
    "sh": "exec 9>&1 1>&2; exec /bin/sh -i",
}
# Shells that can (bash, busybox ash; dash only knows fds 0-9) then move the channel off
# fd 9, which scripts use themselves (``exec 9>lock; flock 9``).
_HIGH_FD = 57
PROBE_LIMIT = 4096
_NOISE_LIMIT = 16 * 1024  # what the shell printed for itself, kept to report syntax errors
_PS2_QUIET_S = 0.3  # how long the sentinel may still follow a continuation prompt
# Backstop for an end mark that never comes (a command closed the shell's own stderr);
# a command's timeout, when it has one, bounds that wait first.
_MARK_LIMIT_S = 30.0


class ContinuationPrompt(Exception):
    """The shell printed one PS2 marker more than a complete command produces."""


class ShellExited(Exception):
    """The shell's exec stream ended (``exit``, killed, container gone)."""


class ShellWire:
    """The state of the wire to one shell: its channel, the sentinel numbering, the
    marks read so far, and what the launch found out (kind, pid, data fd, parser)."""

    def __init__(self, container: ShellHost, *, shell: ShellKind, token: str | None) -> None:
        token = token or secrets.token_hex(8)
        self._token = token
        self.container = container
        self.requested_shell: ShellKind = shell
        self.kind = ""
        self.pid = 0
        self.start_timeout_s = 30.0
        self._marker = f"__llps2_{token}_"  # PS2 prints this, a sentinel number, then "__"
        # The number is expanded when the prompt is printed, so the text of the assignment
        # (echoed by ``set -v``, traced by ``set -x``) never looks like a prompt.
        self._ps2 = f"'{self._marker}${{__llenvs_p}}__'"
        self._promptvars = ""  # bash: keep prompt expansion on
        self._tag = f"__llend_{token}_"
        self._data = Scanner(self._tag.encode(), b"\n")
        self._noise = Scanner(self._marker.encode(), b"__")
        self._fd = 9
        self._prompt_seq = b""  # the number in the PS2 the shell prints now
        self._flags = ""  # the shell's ``$-`` after the last command
        self._seq = 0
        self._mark = 0  # the highest end mark read on the shell's channel
        self._stream: ShellChannel | None = None
        self._check_syntax_first = False
        self._parser = "sh"

    def _pending(self, seq: int, limit: int) -> Pending:
        return Pending(
            cmd_seq=seq,
            target=seq,
            out=CappedOutput(limit),
            noise=CappedOutput(_NOISE_LIMIT),
            mark=self._mark,
        )

    async def _launch(self) -> None:
        self._stream = await self.container.open_channel(
            ["/bin/sh", "-c", LAUNCH[self.requested_shell]]
        )
        self._data = Scanner(self._tag.encode(), b"\n")
        self._noise = Scanner(self._marker.encode(), b"__")
        seq = self._next_seq()
        self._mark = seq - 1  # a new channel: nothing on it is stale
        init = (
            f"PS1=''; __llenvs_p={seq}; PS2={self._ps2}; unset HISTFILE; __llenvs_fd=9; "
            '[ -n "$BASH_VERSION" ] && set +H +o history; '
            f"if ( exec {_HIGH_FD}>&9 ) 2>/dev/null; then "
            f"exec {_HIGH_FD}>&9 9>&-; __llenvs_fd={_HIGH_FD}; fi; "
            f"\\command printf '{self._tag}{seq}:0:%d:%d:%s:%s\\n' $$ $__llenvs_fd "
            '"${BASH_VERSION:+bash}" "$(readlink /proc/$$/exe 2>/dev/null)" >&$__llenvs_fd; '
            f"{self._mark_printf(seq)}\n"
        )
        # Done once the shell's channel is read up to the init line's mark: the start-up
        # text (busybox's "can't access tty", a first prompt) can then never reach a command.
        pending = self._pending(seq, PROBE_LIMIT)
        pending.sync = pending.one_line = True
        try:
            await self._write(init.encode())
            async with asyncio.timeout(self.start_timeout_s):
                await self._pump(pending)
        except (TimeoutError, ShellExited) as exc:
            await self._close_stream()
            raise ContainerError(
                f"the shell did not start in container {self.container.short_id}: "
                f"{(pending.out.text() + pending.noise.text()).strip()[-300:]!r}",
                container_id=self.container.id,
            ) from exc
        pid, fd, kind, exe = [*pending.payload.split(":", 3), "", "", ""][:4]
        self.pid, self._fd = int(pid), int(fd)
        self.kind = kind or "sh"
        self._promptvars = "\\shopt -s promptvars; " if self.kind == "bash" else ""
        self._flags = ""
        # bash and busybox ash keep reading after a syntax error; others (dash) drop the
        # rest of their input, our sentinel included: check those commands' syntax first.
        self._check_syntax_first = self.kind != "bash" and not exe.endswith("busybox")
        # The parser by path, as the user's PATH or aliases may hide it.
        name = "bash" if self.kind == "bash" else "sh"
        self._parser = f"{exe} sh" if exe.endswith("busybox") else exe or name

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _mark_printf(self, seq: int) -> str:
        """Prints the end mark of ``seq`` on the shell's own channel. The mark's text never
        appears in the line itself, so ``set -v`` echoes and ``set -x`` traces of it are
        not marks."""
        return f"\\command printf '{self._marker}e%d__' {seq} >&2"

    def _sentinel_line(self, seq: int) -> bytes:
        r"""Saves ``$?``, resets PS2 (its prompts numbered ``seq``) and job control (``set -m``
        without a terminal only adds "[1]+ Done" lines to later output), prints the tag, ``seq``,
        ``$?`` and ``$-`` to the data channel and an end mark on the shell's own channel (the
        two are copied independently: the mark says where this line's share of the shell's
        channel ends, syntax errors included); then restores ``$?`` in an ``&&`` list, which
        ``set -e`` and the ERR trap ignore. Command words are ``\``-escaped (aliases cannot
        touch them), expansions quoted (``IFS`` cannot split them).
        """
        return (
            f"__llenvs_rc=$?; __llenvs_p={seq}; PS2={self._ps2}; {self._promptvars}\\set +m; "
            f'\\command printf \'{self._tag}{seq}:%d:%s\\n\' "$__llenvs_rc" "$-" >&{self._fd}; '
            f"{self._mark_printf(seq)}; "
            '__llenvs_rc() { \\return "$1"; }; __llenvs_rc "$__llenvs_rc" && \\:\n'
        ).encode()

    async def _write(self, data: bytes) -> None:
        if self._stream is None:
            raise ShellExited
        try:
            await self._stream.write_in(data)
        except (OSError, RuntimeError, AssertionError) as exc:
            raise ShellExited from exc

    async def _pump(self, p: Pending) -> None:
        """Read until the sentinel of ``p.target`` arrives (the last line the shell ran: the
        next command's prompts carry its number) and, where ``p`` needs it, its end mark."""
        try:
            await self._read(p)
        finally:
            if p.done:
                self._prompt_seq = str(p.target).encode()

    async def _read(self, p: Pending) -> None:
        assert self._stream is not None
        loop = asyncio.get_running_loop()
        # Since when the sentinel is awaited after one prompt too many (the shell may wait
        # for more input), and until when an end mark is awaited after the sentinel.
        ps2_since: float | None = None
        mark_deadline: float | None = None
        while not p.complete:
            if p.done and mark_deadline is None:
                mark_deadline = loop.time() + _MARK_LIMIT_S
            if p.done:
                deadline = mark_deadline
            else:
                deadline = None if ps2_since is None else ps2_since + _PS2_QUIET_S
            try:
                async with asyncio.timeout_at(deadline) as quiet:
                    message = await self._stream.read_out()
            except TimeoutError:
                if quiet.expired() and p.done:
                    return  # the mark never came: ``p.marked`` stays false
                if quiet.expired():  # no sentinel after the prompt: the shell waits
                    raise ContinuationPrompt from None
                raise
            except (OSError, RuntimeError) as exc:
                raise ShellExited from exc
            if message is None:
                raise ShellExited
            if message.stream != 2:
                for kind, payload in self._data.feed(message.data):
                    if kind == DATA:
                        p.out.feed(payload)
                    else:
                        self._on_sentinel(p, payload.decode("ascii", "replace"))
                continue
            for kind, payload in self._noise.feed(message.data):
                if kind == DATA:
                    # Only once the line before the command has ended on this channel: what
                    # comes earlier is start-up text or an earlier command's late output.
                    if self._mark >= p.cmd_seq - 1 and (p.ps2 or p.one_line):
                        p.noise.feed(payload)
                elif payload[:1] == b"e" and payload[1:].isdigit():
                    self._mark = p.mark = max(self._mark, int(payload[1:]))
                elif payload == self._prompt_seq:
                    if p.ps2_limit is None or p.ps2 + 1 < p.ps2_limit:
                        p.ps2 += 1
                    elif ps2_since is None:
                        ps2_since = loop.time()

    def _on_sentinel(self, p: Pending, payload: str) -> None:
        seq, _, rest = payload.partition(":")
        if not seq.isdigit():
            return
        if int(seq) == p.cmd_seq:
            self._flags = rest.partition(":")[2]
        p.on_sentinel(int(seq), rest)

    async def _exit_code(self) -> int | None:
        return None if self._stream is None else await self._stream.exit_code()

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
