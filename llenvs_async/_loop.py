"""Which event loop the CLI and benchmarks run on: uvloop when installed (extra
``[uvloop]``), else asyncio's own. Library users choose their loop themselves.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from .errors import MissingExtraError

__all__ = ["LoopKind", "loop_factory", "resolve_loop", "run"]

T = TypeVar("T")
LoopKind = Literal["auto", "asyncio", "uvloop"]
_ENV = "LLENVS_LOOP"


def resolve_loop(kind: str | None = None) -> Literal["asyncio", "uvloop"]:
    """``auto`` (the default, or ``$LLENVS_LOOP``): uvloop if importable, else asyncio."""
    kind = kind or os.environ.get(_ENV) or "auto"
    if kind not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"{_ENV} / loop must be auto, asyncio or uvloop, got {kind!r}")
    available = importlib.util.find_spec("uvloop") is not None
    if kind == "uvloop" and not available:
        raise MissingExtraError(f"{_ENV}=uvloop", extra="uvloop", package="uvloop")
    if kind == "auto":
        return "uvloop" if available else "asyncio"
    return kind  # type: ignore[return-value]


def loop_factory(kind: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A loop factory for ``asyncio.Runner`` (None: asyncio's default loop)."""
    if resolve_loop(kind) == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, loop: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)
