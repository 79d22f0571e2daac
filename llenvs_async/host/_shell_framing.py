"""The shell session's framing: splitting the data channel into output and sentinels
(``Scanner``), the command in flight (``Pending``) and the rules for sending a command.

See ``shell.py`` for the protocol these implement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._output import CappedOutput

__all__ = [
    "DATA",
    "SYNTAX_ERROR",
    "TAGGED",
    "Pending",
    "Scanner",
    "is_brace_error",
    "is_incomplete",
    "one_line",
]

DATA, TAGGED = 0, 1
_TAG_LIMIT = 8192  # a tag without its end this far on is output, not ours
SYNTAX_ERROR = "syntax error"


def is_brace_error(line: str) -> bool:
    """A shell's syntax error about an unexpected ``}`` (bash and ash wordings)."""
    return SYNTAX_ERROR in line.lower() and ("`}'" in line or '"}"' in line)


def one_line(body: str) -> bool:
    """Whether ``body`` can run as ``{ body; }`` on one line, the shell then printing no
    prompt at all: no comment or heredoc could take our ``; }``, and it does not end in an
    operator (``&``, ``;``, ``|``, a backslash...) that our ``;`` would make an error."""
    if any(sign in body for sign in ("\n", "#", "<<")):
        return False
    return body.rstrip()[-1:] not in ("", *";&|\\(<>!{")


def is_incomplete(parse_errors: str) -> bool:
    """Whether a parser's complaint means "input ended too early" rather than "invalid"."""
    text = parse_errors.lower()
    return any(sign in text for sign in ("end of file", "unexpected eof", "unterminated"))


class Scanner:
    """Splits a byte stream into data and tagged items (``TAG payload END``), across chunks."""

    __slots__ = ("_end", "_keep", "_pending", "_tag")

    def __init__(self, tag: bytes, end: bytes) -> None:
        self._tag, self._end = tag, end
        self._keep = len(tag) - 1
        self._pending = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._pending + data if self._pending else data
        events: list[tuple[int, bytes]] = []
        pos = 0
        while True:
            t = buf.find(self._tag, pos)
            if t < 0:
                end = self._partial_start(buf, max(pos, len(buf) - self._keep))
                break
            close = buf.find(self._end, t + len(self._tag))
            if close < 0 and len(buf) - t <= _TAG_LIMIT:
                end = t
                break
            if close < 0:  # no end this far on: not one of ours
                events.append((DATA, buf[pos : t + len(self._tag)]))
                pos = t + len(self._tag)
                continue
            if t > pos:
                events.append((DATA, buf[pos:t]))
            events.append((TAGGED, buf[t + len(self._tag) : close]))
            pos = close + len(self._end)
        if end > pos:
            events.append((DATA, buf[pos:end]))
        self._pending = buf[end:]
        return events

    def _partial_start(self, buf: bytes, start: int) -> int:
        """Where a suffix of ``buf`` that may begin the tag starts (else its end)."""
        for i in range(start, len(buf)):
            if self._tag.startswith(buf[i:]):
                return i
        return len(buf)


@dataclass(slots=True, kw_only=True)
class Pending:
    """What has been read for the command in flight (a mutable accumulator).

    ``cmd_seq`` numbers the command's own sentinel, ``target`` the one that ends the wait
    (the same, or a resync sentinel sent after an interrupt). ``noise``: what the shell
    printed for itself for this command (its syntax errors land there). ``mark``: the
    highest end mark read on the shell's channel; every sentinel line prints one there,
    so a mark proves that channel is read up to that line. ``sync``: wait for the target's
    mark even when the exit code is not 2 (the launch: the start-up text must be consumed).
    """

    cmd_seq: int
    target: int
    out: CappedOutput
    noise: CappedOutput
    ps2_limit: int | None = None
    one_line: bool = False
    ps2: int = 0
    rc: int | None = None
    payload: str = ""
    done: bool = False
    timed_out: bool = False
    stopped: str | None = None
    continuation: bool = False
    restarted: bool = False
    exited: bool = False
    sync: bool = False
    mark: int = 0

    @property
    def marked(self) -> bool:
        """The shell's channel has been read past the target's sentinel line."""
        return self.mark >= self.target

    @property
    def complete(self) -> bool:
        """The target sentinel arrived, and after a possible syntax error (exit code 2, its
        message printed on the shell's channel) or when syncing, also the end mark there."""
        return self.done and (self.marked or (self.rc != 2 and not self.sync))

    def on_sentinel(self, seq: int, rest: str) -> None:
        code, _, extra = rest.partition(":")
        if seq == self.cmd_seq and code.isdigit():
            self.rc = int(code)
        if seq == self.target:
            self.done = True
            self.payload = extra
            if self.rc is None and code.isdigit():
                self.rc = int(code)
