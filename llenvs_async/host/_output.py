"""Command results and bounded output capture (head and tail kept, the middle counted)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "CappedOutput", "CommandResult"]

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandResult:
    """One command's combined stdout+stderr and how it ended. ``continuation_prompt``: the
    shell wanted more input and the command was discarded; ``shell_restarted``: state lost;
    ``stopped``: why the caller's watch interrupted it (``ShellSession.run``'s ``stop``).
    """

    output: str
    exit_code: int | None
    timed_out: bool = False
    continuation_prompt: bool = False
    truncated_bytes: int = 0
    duration_s: float = 0.0
    shell_restarted: bool = False
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == 0
            and not self.timed_out
            and not self.continuation_prompt
            and self.stopped is None
        )


class CappedOutput:
    """Accumulates a byte stream keeping the first and last ``limit // 2`` bytes.

    Memory stays O(limit) however much is fed; ``text()`` decodes with replacement
    characters, so binary output never raises.
    """

    __slots__ = ("_head", "_head_limit", "_tail", "_tail_limit", "total")

    def __init__(self, limit: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        if limit < 2:
            raise ValueError(f"output limit must be >= 2 bytes, got {limit!r}")
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._tail_limit:
                del self._tail[: len(self._tail) - self._tail_limit]

    @property
    def truncated_bytes(self) -> int:
        return max(0, self.total - len(self._head) - min(len(self._tail), self._tail_limit))

    def text(self) -> str:
        tail = bytes(self._tail[-self._tail_limit :]) if self._tail else b""
        head = self._head.decode("utf-8", "replace")
        if not self.truncated_bytes:
            return (bytes(self._head) + tail).decode("utf-8", "replace")
        marker = f"\n[... {self.truncated_bytes} bytes of output truncated ...]\n"
        return head + marker + tail.decode("utf-8", "replace")
