"""``examples/train_tiny_rl.py --quick`` on the real vLLM CPU engine: the tiny model learns.

Runs the script as a program (vLLM spawns its engine core: keep it out of pytest's process)
and checks what it printed: both estimators improve the success rate by a margin no chance
fluctuation of that sample size explains, every batch came from a newer policy version than
the last, and no batch was more than the stream's ``max_staleness`` versions behind.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest

from tests.engine.conftest import vllm_ready  # noqa: F401  (a fixture: skip, or fail in CI)

from .conftest import load_example, run_example

pytestmark = pytest.mark.vllm

_STEP = re.compile(
    r"^\[(\w+)\] step +(\d+) +success ([\d.]+) +loss \S+ +staleness (\d+) +versions \[([\d, ]*)\]"
    r" +failed (\d+)"
)
_SUMMARY = re.compile(
    r"^\[(\w+)\] success (\d+)/(\d+) -> (\d+)/(\d+) eval episodes;.*max staleness (\d+)"
)
# One-sided two-proportion z-test at p < 0.001: the improvement is not sampling noise.
Z_CRITICAL = 3.09


def z_score(before: int, after: int, n: int) -> float:
    """Two-proportion z statistic for ``after/n`` over ``before/n`` (pooled variance)."""
    pooled = (before + after) / (2 * n)
    spread = math.sqrt(pooled * (1 - pooled) * 2 / n)
    return (after - before) / n / spread if spread > 0 else 0.0  # spread 0: before == after


def test_z_score_separates_noise_from_learning() -> None:
    assert z_score(12, 90, 96) > Z_CRITICAL
    assert z_score(30, 40, 96) < Z_CRITICAL  # 0.31 -> 0.42 on 96 episodes could be luck
    assert z_score(40, 30, 96) < 0


@pytest.mark.timeout(600 + 120)
def test_quick_run_learns_with_both_estimators_and_bounded_staleness(vllm_ready: str) -> None:  # noqa: F811
    example = load_example("train_tiny_rl.py")
    bound = example.Config.quick().max_staleness
    out = run_example("train_tiny_rl.py", "--quick", "--estimator", "both", timeout=600).stdout
    steps: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {"grpo": [], "vine": []}
    summaries = {}
    for line in out.splitlines():
        if m := _STEP.match(line):
            versions = tuple(int(v) for v in m[5].split(",") if v.strip())
            steps[m[1]].append((int(m[2]), int(m[4]), versions))
        elif m := _SUMMARY.match(line):
            summaries[m[1]] = (int(m[2]), int(m[4]), int(m[3]), int(m[6]))
    assert set(summaries) == {"grpo", "vine"}, out
    for estimator, rows in steps.items():
        assert [r[0] for r in rows] == list(range(example.Config.quick().steps)), out
        before, after, n, max_seen = summaries[estimator]
        assert z_score(before, after, n) > Z_CRITICAL, (estimator, before, after, n)
        # every batch's actions came from a version no older than the previous batch's
        newest = [max(r[2]) for r in rows]
        oldest = [min(r[2]) for r in rows]
        assert all(a <= b for a, b in itertools.pairwise(oldest)), rows
        assert newest[-1] > newest[0], rows  # the engine served the trainer's new weights
        assert all(staleness <= bound for _, staleness, _ in rows), rows
        assert max_seen <= bound
    assert re.search(
        r"^success rate: [\d.]+ -> [\d.]+, [\d.]+ -> [\d.]+ \(grpo, vine\)$", out, re.M
    )
