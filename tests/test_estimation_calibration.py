"""Calibration: the 95% intervals cover the true value as often as the method promises.

A one-step ChainEnv is a bandit with analytic V = p: a stochastic scripted policy says
"right" (reward 1) with probability p, drawn from ``request.seed``, the per-request seed the
runner derives. Each (p, n) runs R repetitions as one ``estimate_values`` call over R copies
of the start state, through the real ``TrajectoryRunner``. Empirical coverage must agree with
the method's exact coverage (enumerated over the binomial) within sampling error.

Run with ``-s`` to print the calibration tables (coverage, exact coverage, mean width).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from llenvs_async import GenerationRequest, SamplingParams, ScriptedBackend, TrajectoryRunner
from llenvs_async.envs import ChainEnv
from llenvs_async.estimation import ValueEstimate, estimate_values, summarize_returns

REPS = 1000
CASES = [(0.05, 20), (0.3, 20), (0.7, 10)]
Interval = Callable[[int, int], tuple[float, float]]


def _binom(n: int, k: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def _exact(interval: Interval, p: float, n: int) -> tuple[float, float]:
    """Exact coverage and mean width of ``interval(successes, n)`` at success probability p."""
    coverage = width = 0.0
    for k in range(n + 1):
        low, high = interval(k, n)
        coverage += _binom(n, k, p) * (low <= p <= high)
        width += _binom(n, k, p) * (high - low)
    return coverage, width


def _ours(k: int, n: int) -> tuple[float, float]:
    return summarize_returns([1.0] * k + [0.0] * (n - k), reward_range=(0.0, 1.0)).ci


def _clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """The exact (conservative) binomial interval, by bisection on the binomial tail."""

    def solve(upper_tail: Callable[[float], float], target: float) -> float:
        a, b = 0.0, 1.0  # upper_tail(p) increases with p; find upper_tail(p) = target
        for _ in range(60):
            mid = (a + b) / 2
            a, b = (mid, b) if upper_tail(mid) < target else (a, mid)
        return (a + b) / 2

    def at_least(j0: int) -> Callable[[float], float]:
        return lambda p: sum(_binom(n, j, p) for j in range(j0, n + 1))

    low = 0.0 if k == 0 else solve(at_least(k), 0.025)  # P(X >= k | low) = 2.5%
    high = 1.0 if k == n else solve(at_least(k + 1), 0.975)  # P(X <= k | high) = 2.5%
    return low, high


def _hoeffding(k: int, n: int) -> tuple[float, float]:
    half = math.sqrt(math.log(2 / 0.05) / (2 * n))
    return max(k / n - half, 0.0), min(k / n + half, 1.0)


def _bandit_policy(p: float) -> Callable[[GenerationRequest], str]:
    def policy(request: GenerationRequest) -> str:
        assert request.seed is not None, "the runner must derive a seed per request"
        return "right" if random.Random(request.seed).random() < p else "left"

    return policy


async def _estimates(p: float, n: int, base_seed: int) -> list[ValueEstimate]:
    env = ChainEnv(min_length=1, num_tasks=1, max_steps=1)  # one step: reward 1 w.p. p
    start = await env.reset(0)
    backend = ScriptedBackend(_bandit_policy(p))
    runner = TrajectoryRunner(env, backend, SamplingParams(seed=base_seed))
    return await estimate_values(runner, [start] * REPS, n)


def _sigma(c: float, reps: int) -> float:
    return math.sqrt(c * (1 - c) / reps)


@pytest.mark.parametrize(("p", "n"), CASES)
async def test_wilson_coverage_through_the_runner_matches_the_exact_coverage(
    p: float, n: int
) -> None:
    estimates = await _estimates(p, n, base_seed=2026)
    assert len(estimates) == REPS
    assert all(e.n == n and e.failed == 0 and e.method == "wilson" for e in estimates)
    for e in estimates:  # inside the range, never zero-width
        assert 0.0 <= e.ci_low <= e.mean <= e.ci_high <= 1.0
        assert e.ci_high - e.ci_low > 0.05
    # independent samples: the pooled mean is p, and the per-repetition counts have the
    # binomial variance n p (1 - p) (identical samples within a repetition would give n^2 p (1-p))
    counts = [round(e.mean * n) for e in estimates]
    pooled = sum(counts) / (REPS * n)
    assert abs(pooled - p) < 4 * math.sqrt(p * (1 - p) / (REPS * n))
    mean_k = sum(counts) / REPS
    var_k = sum((k - mean_k) ** 2 for k in counts) / (REPS - 1)
    assert var_k == pytest.approx(n * p * (1 - p), rel=0.2)

    covered = sum(e.ci_low <= p <= e.ci_high for e in estimates) / REPS
    exact, exact_width = _exact(_ours, p, n)
    width = sum(e.ci_high - e.ci_low for e in estimates) / REPS
    print(
        f"\nwilson p={p} n={n}: coverage {covered:.3f} (exact {exact:.3f}), "
        f"mean width {width:.3f} (exact {exact_width:.3f})"
    )
    assert abs(covered - exact) < 4 * _sigma(exact, REPS)
    assert covered >= 0.90 and exact >= 0.90
    assert width == pytest.approx(exact_width, abs=0.02)


def test_exact_coverage_of_the_binary_methods() -> None:
    """The table behind the choice of Wilson: its exact coverage oscillates around 95% and
    stays above 90% here, with narrower intervals than Clopper-Pearson (always >= 95%) or
    Hoeffding/Anderson (what the bounded-range method gives on 0/1 data).
    """
    expected_wilson = {(0.05, 20): 0.9245, (0.3, 20): 0.9752, (0.7, 10): 0.9244}
    print("\n(p, n)     | wilson cov  width | clopper-pearson cov  width | hoeffding cov  width")
    for p, n in CASES:
        wilson, w_width = _exact(_ours, p, n)
        cp, cp_width = _exact(_clopper_pearson, p, n)
        hoeff, h_width = _exact(_hoeffding, p, n)
        print(f"({p}, {n}) | {wilson:.4f} {w_width:.3f} | {cp:.4f} {cp_width:.3f} | "
              f"{hoeff:.4f} {h_width:.3f}")  # fmt: skip
        assert wilson == pytest.approx(expected_wilson[(p, n)], abs=5e-4)
        assert cp >= 0.95 and hoeff >= 0.95
        assert w_width < cp_width < h_width


def test_wilson_is_never_zero_width_and_never_leaves_the_range() -> None:
    for n in (1, 2, 5, 16, 100):
        for k in range(n + 1):
            e = summarize_returns([2.0] * k + [-1.0] * (n - k), reward_range=(-1.0, 2.0))
            assert e.method == "wilson"
            assert -1.0 <= e.ci_low <= e.mean <= e.ci_high <= 2.0
            assert e.ci_high - e.ci_low > 0.0
    all_ones = summarize_returns([1.0] * 16, reward_range=(0.0, 1.0))
    assert all_ones.ci_high == 1.0 and all_ones.ci_low == pytest.approx(0.806, abs=1e-3)


# ---- the bounded-range method on non-binary returns ------------------------------------


def _coverage(
    draw: Callable[[random.Random], float],
    true_mean: float,
    n: int,
    reward_range: tuple[float, float],
    reps: int = 600,
    seed: int = 7,
) -> tuple[float, float, list[ValueEstimate]]:
    rng = random.Random(seed)
    estimates = [
        summarize_returns([draw(rng) for _ in range(n)], reward_range=reward_range)
        for _ in range(reps)
    ]
    covered = sum(e.ci_low <= true_mean <= e.ci_high for e in estimates) / reps
    width = sum(e.ci_high - e.ci_low for e in estimates) / reps
    return covered, width, estimates


def _student_t_coverage(
    draw: Callable[[random.Random], float], true_mean: float, n: int, reps: int = 600
) -> tuple[float, float]:
    """The old interval (Student-t, unbounded range), on the same draws, for comparison."""
    covered, width, _ = _coverage(draw, true_mean, n, (-math.inf, math.inf), reps)
    return covered, width


BETA_CASES = [(2.0, 5.0, 5), (2.0, 5.0, 20), (0.5, 0.5, 20), (5.0, 1.0, 100)]


@pytest.mark.parametrize(("a", "b", "n"), BETA_CASES)
def test_anderson_covers_beta_distributed_returns(a: float, b: float, n: int) -> None:
    lo, hi = -1.0, 3.0  # Beta(a, b) rescaled onto a range that is not [0, 1]

    def draw(rng: random.Random) -> float:
        return lo + (hi - lo) * rng.betavariate(a, b)

    true_mean = lo + (hi - lo) * a / (a + b)
    covered, width, estimates = _coverage(draw, true_mean, n, (lo, hi))
    t_covered, t_width = _student_t_coverage(draw, true_mean, n)
    print(f"\nanderson Beta({a}, {b}) n={n}: coverage {covered:.3f} width {width:.3f} | "
          f"student-t {t_covered:.3f} width {t_width:.3f}")  # fmt: skip
    assert all(e.method == "anderson" for e in estimates)
    assert all(lo <= e.ci_low <= e.mean <= e.ci_high <= hi for e in estimates)
    assert all(e.ci_high > e.ci_low for e in estimates)
    # a finite-sample guarantee: >= 95% for every distribution on the range
    assert covered >= 0.95 - 3 * _sigma(0.95, 600)
    hoeffding_width = 2 * (hi - lo) * math.sqrt(math.log(40) / (2 * n))
    assert width < hoeffding_width  # adapts to the data; Hoeffding's is the worst case


def test_anderson_holds_where_student_t_fails_near_a_bound() -> None:
    """Mostly the maximum, rarely much less: the t interval is often zero-width at 1."""

    def draw(rng: random.Random) -> float:
        return 1.0 if rng.random() < 0.97 else rng.uniform(0.0, 0.5)

    true_mean = 0.97 + 0.03 * 0.25
    covered, width, _ = _coverage(draw, true_mean, 20, (0.0, 1.0))
    t_covered, t_width = _student_t_coverage(draw, true_mean, 20)
    print(f"\nnear-bound n=20: ours {covered:.3f} width {width:.3f} | "
          f"student-t {t_covered:.3f} width {t_width:.3f}")  # fmt: skip
    assert covered >= 0.95 - 3 * _sigma(0.95, 600)
    assert t_covered < 0.6  # the failure this method exists to avoid


def test_anderson_bounds_by_hand() -> None:
    # n = 2 -> eps = sqrt(ln 40 / 4) = 0.9603: the upper bound moves 96% of the mass to hi
    e = summarize_returns([0.2, 0.6], reward_range=(0.0, 1.0))
    eps = math.sqrt(math.log(40) / 4)
    # upper: 1 - (1 - eps) * (1 - 0.6); lower (mirror): (1 - eps) * 0.2
    assert e.ci_high == pytest.approx(1 - (1 - eps) * 0.4)
    assert e.ci_low == pytest.approx((1 - eps) * 0.2)
    assert e.mean == pytest.approx(0.4) and e.method == "anderson"
    single = summarize_returns([0.5], reward_range=(0.0, 1.0))
    assert single.ci == (0.0, 1.0)  # eps > 1 with one sample: the whole range


def test_constant_non_binary_returns_get_a_nonzero_interval() -> None:
    e = summarize_returns([0.8] * 50, reward_range=(0.0, 1.0))
    assert e.ci_low < 0.8 < e.ci_high and e.method == "anderson"
