"""Optional dependencies, imported in one way: a missing one is a ``MissingExtraError`` that
names the extra installing it."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

__all__ = ["import_extra"]


def import_extra(
    module: str, *, extra: str, what: str, package: str, note: str = "", catch_all: bool = False
) -> ModuleType:
    """``module`` imported, else ``MissingExtraError`` saying ``what`` needs ``package`` (the
    ``extra``). ``catch_all``: any error of the import counts (packages that fail on an
    unsupported Python with errors of their own)."""
    caught: type[BaseException] = Exception if catch_all else ImportError
    try:
        return importlib.import_module(module)
    except caught as exc:
        raise MissingExtraError(
            what, extra=extra, package=package, note=note, cause=f"{type(exc).__name__}: {exc}"
        ) from exc
