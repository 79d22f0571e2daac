"""Helpers to run the example scripts as programs and to import them as modules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests._support import run_child
from tests.cli._docker import docker_ready  # noqa: F401  (a fixture)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<name>`` with this interpreter; fails the test on a non-zero exit.
    Past ``timeout`` it is interrupted as by Ctrl-C (``run_child``)."""
    proc = run_child(
        [sys.executable, str(EXAMPLES / name), *args], timeout=timeout, cwd=EXAMPLES.parent
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>`` as a module (without running its ``__main__`` block)."""
    path = EXAMPLES / name
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
