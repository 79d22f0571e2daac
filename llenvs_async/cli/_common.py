"""What every command shares: consoles, one-line errors, and the single ``anyio.run``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from rich.console import Console

from .._loop import resolve_loop
from ..errors import LlenvsError

__all__ = ["CliError", "console", "err_console", "run_async"]

T = TypeVar("T")

# Lines are never wrapped by us (the terminal wraps them): a path or a command in a message
# stays one piece to copy and to match, whatever its length. Tables still fit the width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


class CliError(LlenvsError):
    """A user-facing failure (bad flag, path or input): one line on stderr, exit ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message, code=code)
        self.code = code


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a command's async body: the command's one and only event loop (uvloop when
    installed; ``LLENVS_LOOP=asyncio`` opts out)."""

    async def body() -> T:
        return await fn()

    try:
        use_uvloop = resolve_loop() == "uvloop"
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return anyio.run(body, backend_options={"use_uvloop": use_uvloop})
