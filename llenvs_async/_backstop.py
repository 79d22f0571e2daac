"""The one ``atexit`` backstop: removes what this process still holds (containers, gVisor
sandboxes, snapshot and checkpoint images) when it exits without closing them.

Each kind of resource registers a synchronous remover (at exit the event loop may be gone)
where that resource lives; the hook runs them hosts first, then images (an image a running
container uses cannot be removed).
"""

from __future__ import annotations

import atexit
import sys
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = ["register_removal"]

_STAGES = {"hosts": 0, "images": 1}
_removals: dict[tuple[int, str, str], Callable[[], Sequence[str]]] = {}


def register_removal(
    stage: Literal["hosts", "images"], what: str, where: str, remove: Callable[[], Sequence[str]]
) -> None:
    """Arm ``remove`` (it removes this process's ``what`` at ``where``, returning what it
    removed) for exit; the same ``(stage, what, where)`` registered again is armed once."""
    if not _removals:
        atexit.register(_backstop)
    _removals.setdefault((_STAGES[stage], what, where), remove)


def _backstop() -> None:
    for (_, what, _), remove in sorted(_removals.items(), key=lambda item: item[0]):
        try:
            removed = remove()
        except Exception as exc:  # at exit: report it, and still remove the other kinds
            print(f"llenvs-async: could not remove {what}: {exc}", file=sys.stderr)
            continue
        if removed:
            print(f"llenvs-async: removed {len(removed)} {what}", file=sys.stderr)
