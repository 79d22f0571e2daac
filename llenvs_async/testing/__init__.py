"""Helpers for testing environments and backends: a recording backend and ``check_env``."""

from __future__ import annotations

from ._check_env import check_env
from ._recording import RecordingBackend

__all__ = ["RecordingBackend", "check_env"]
