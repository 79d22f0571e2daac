"""benchmarks/bench_ray.py at tiny sizes: a well-formed result (no timing asserts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests._support import run_child

from .conftest import REPO, require_ray


@pytest.mark.ray
@pytest.mark.timeout(600 + 120)
def test_bench_ray_quick_writes_both_tables(tmp_path: Path) -> None:
    require_ray()
    # Its own clusters (one node, then two): a separate process, not this session's driver.
    proc = run_child(
        [sys.executable, "-m", "benchmarks.bench_ray", "--quick", "--out", str(tmp_path)],
        cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "ray.json").read_text())
    overhead, throughput = result["tables"]
    assert [row[0] for row in overhead["rows"]] == [2, 4]
    assert [row[-1] for row in overhead["rows"]] == [2, 2]  # instances on both nodes
    assert [row[-1] for row in throughput["rows"][:2]] == [1, 2]
    cpu = overhead["columns"].index("Ray machine CPU ms/round")
    bare_cpu = overhead["columns"].index("bare round machine CPU ms")
    cells = [str(row[c]).replace(",", "") for row in overhead["rows"] for c in (cpu, bare_cpu)]
    assert all(float(cell) >= 0 for cell in cells), cells  # /proc/stat ticks: 0 at tiny sizes
    assert {t["name"] for t in result["targets"]} and (tmp_path / "ray.md").exists()
