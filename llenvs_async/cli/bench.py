"""``llenvs-async bench``: run the benchmark suite (``python -m benchmarks.run_all``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from ._common import CliError

__all__ = ["bench", "find_benchmarks"]


def find_benchmarks() -> Path | None:
    """The directory holding ``benchmarks/run_all.py``: the working directory or the checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "benchmarks" / "run_all.py").is_file():
            return root
    return None


def bench(ctx: typer.Context) -> None:
    """Run the benchmarks (extra arguments are passed on to benchmarks.run_all)."""
    root = find_benchmarks()
    if root is None:
        raise CliError("no benchmarks/run_all.py here or in the llenvs-async checkout", code=1)
    code = subprocess.call([sys.executable, "-m", "benchmarks.run_all", *ctx.args], cwd=root)
    if code:
        raise typer.Exit(code)
