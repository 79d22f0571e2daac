"""Import an optional dependency of a test module: skipped locally, FAILED in CI (``CI=true``)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def import_or_fail(name: str, hint: str = "run 'make vllm' (it brings torch)") -> ModuleType:
    """``pytest.importorskip`` that fails instead of skipping when ``CI`` is set."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        message = f"{name} is not importable ({exc}): {hint}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)
