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


async def test_discounted_chain_through_the_runner_is_covered() -> None:
    """gamma < 1 on a corridor of length 1 within 3 steps: returns 0, 1, gamma, gamma^2, so the
    bounded-range method runs, end to end; V = sum_k q (1 - q)^(k-1) gamma^(k-1)."""
    q, gamma, n, reps = 0.4, 0.8, 20, 400
    env = ChainEnv(min_length=1, num_tasks=1, max_steps=3)
    start = await env.reset(0)
    runner = TrajectoryRunner(env, ScriptedBackend(_bandit_policy(q)), SamplingParams(seed=11))
    estimates = await estimate_values(runner, [start] * reps, n, gamma=gamma)
    true_v = sum(q * (1 - q) ** k * gamma**k for k in range(3))
    assert {e.method for e in estimates} == {"betting"}
    assert {r for e in estimates for r in e.returns} == {0.0, 1.0, gamma, gamma**2}
    assert all(0.0 <= e.ci_low < e.ci_high <= 1.0 for e in estimates)
    covered = sum(e.ci_low <= true_v <= e.ci_high for e in estimates) / reps
    width = sum(e.ci_high - e.ci_low for e in estimates) / reps
    print(f"\nbetting, discounted chain V={true_v:.3f} n={n}: coverage {covered:.3f}, "
          f"mean width {width:.3f}")  # fmt: skip
    assert covered >= 0.95 - 3 * _sigma(0.95, reps)


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


def _plain_wilson(k: int, n: int) -> tuple[float, float]:
    z = 1.959963984540054
    p, d = k / n, 1 + z * z / n
    center, half = (
        (p + z * z / (2 * n)) / d,
        z / d * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)),
    )
    return max(center - half, 0.0), min(center + half, 1.0)


@pytest.mark.parametrize("n", [10, 20, 50])
def test_the_poisson_correction_lifts_wilsons_worst_case(n: int) -> None:
    """Plain Wilson covers only ~84% at p ~ 0.4/n (a task the policy rarely solves)."""
    grid = [i / 4000 for i in range(1, 4000)]

    def worst_and_width(interval: Interval) -> tuple[float, float]:
        cis = [interval(k, n) for k in range(n + 1)]
        worst = min(
            sum(_binom(n, k, p) for k, (a, b) in enumerate(cis) if a <= p <= b) for p in grid
        )
        return worst, sum(b - a for a, b in cis)

    (ours, width), (plain, plain_width) = worst_and_width(_ours), worst_and_width(_plain_wilson)
    print(f"\nn={n}: worst coverage {ours:.3f} (plain Wilson {plain:.3f}), "
          f"width +{100 * (width / plain_width - 1):.1f}%")  # fmt: skip
    assert plain < 0.85 and ours > 0.91
    assert width < 1.02 * plain_width


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


def _anderson(values: list[float], lo: float, hi: float) -> tuple[float, float]:
    """Anderson's DKW-band bound, the alternative the betting interval was chosen over:
    move eps of mass from the smallest returns to hi (upper) or the largest to lo (lower).
    """
    n = len(values)
    eps = math.sqrt(math.log(2 / 0.05) / (2 * n))

    def upper(xs: list[float]) -> float:
        area = 0.0
        for i in range(1, n + 1):
            if i / n > eps:
                area += (i / n - eps) * ((xs[i] if i < n else hi) - xs[i - 1])
        return hi - area

    return lo + hi - upper(sorted(lo + hi - r for r in values)), upper(sorted(values))


def _coverage(
    draw: Callable[[random.Random], float],
    true_mean: float,
    n: int,
    reward_range: tuple[float, float],
    reps: int = 400,
) -> dict[str, tuple[float, float]]:
    """Coverage and mean width of ours, Anderson's and Student-t on the same draws."""
    rng = random.Random(7)
    lo, hi = reward_range
    stats: dict[str, list[tuple[float, float]]] = {"ours": [], "anderson": [], "student-t": []}
    methods = set()
    for _ in range(reps):
        returns = [draw(rng) for _ in range(n)]
        ours = summarize_returns(returns, reward_range=reward_range)
        methods.add(ours.method)
        assert lo <= ours.ci_low <= ours.mean <= ours.ci_high <= hi
        assert ours.ci_high > ours.ci_low
        t = summarize_returns(returns, reward_range=(-math.inf, math.inf))
        for name, ci in (("ours", ours.ci), ("anderson", _anderson(returns, lo, hi)),
                         ("student-t", t.ci)):  # fmt: skip
            stats[name].append(ci)
    assert methods <= {"betting", "wilson"}
    return {
        name: (
            sum(low <= true_mean <= high for low, high in cis) / reps,
            sum(high - low for low, high in cis) / reps,
        )
        for name, cis in stats.items()
    }


def _show(label: str, table: dict[str, tuple[float, float]]) -> None:
    cells = " | ".join(f"{k} {cov:.3f} w {width:.3f}" for k, (cov, width) in table.items())
    print(f"\n{label}: {cells}")


BETA_CASES = [(2.0, 5.0, 5), (2.0, 5.0, 20), (0.5, 0.5, 20), (5.0, 1.0, 100), (2.0, 5.0, 200)]


@pytest.mark.parametrize(("a", "b", "n"), BETA_CASES)
def test_betting_interval_covers_beta_distributed_returns(a: float, b: float, n: int) -> None:
    lo, hi = -1.0, 3.0  # Beta(a, b) rescaled onto a range that is not [0, 1]

    def draw(rng: random.Random) -> float:
        return lo + (hi - lo) * rng.betavariate(a, b)

    table = _coverage(draw, lo + (hi - lo) * a / (a + b), n, (lo, hi))
    _show(f"Beta({a}, {b}) on [-1, 3], n={n}", table)
    covered, width = table["ours"]
    # a finite-sample guarantee: >= 95% for every distribution on the range
    assert covered >= 0.95 - 3 * _sigma(0.95, 400)
    assert width < 2 * (hi - lo) * math.sqrt(math.log(40) / (2 * n))  # Hoeffding's width
    if n >= 20:
        assert width < table["anderson"][1]  # the reason for the choice


def test_discounted_success_is_covered() -> None:
    """gamma < 1 turns 0/1 rewards into returns gamma^k: bounded, not binary."""

    def draw(rng: random.Random) -> float:
        return 0.95 ** rng.randint(1, 8) if rng.random() < 0.3 else 0.0

    true_mean = 0.3 * sum(0.95**k for k in range(1, 9)) / 8
    table = _coverage(draw, true_mean, 32, (0.0, 1.0))
    _show("0.3 x 0.95^U{1..8}, n=32", table)
    assert table["ours"][0] >= 0.95 - 3 * _sigma(0.95, 400)


def test_betting_holds_where_student_t_fails_near_a_bound() -> None:
    """Mostly the maximum, rarely much less: the t interval is often zero-width at 1."""

    def draw(rng: random.Random) -> float:
        return 1.0 if rng.random() < 0.97 else rng.uniform(0.0, 0.5)

    table = _coverage(draw, 0.97 + 0.03 * 0.25, 20, (0.0, 1.0))
    _show("near the upper bound, n=20", table)
    assert table["ours"][0] >= 0.95 - 3 * _sigma(0.95, 400)
    assert table["student-t"][0] < 0.6  # the failure this method exists to avoid


def _brute_force(values: list[float]) -> list[float]:
    """The betting interval's accepted means on a grid, by direct evaluation of both
    bettors' running wealth (independent of the bisection in the implementation)."""
    n = len(values)
    bets, total, squares = [], 0.0, 0.25
    for i, x in enumerate(values):
        bets.append(math.sqrt(2 * math.log(40) / (n * squares / (i + 1))))
        squares += (x - (0.5 + total) / (i + 1)) ** 2
        total += x
    accepted = []
    for g in range(1, 1000):
        m = g / 1000
        up = down = 1.0
        ok = True
        for x, bet in zip(values, bets, strict=True):
            up *= 1 + min(bet, 0.75 / m) * (x - m)
            down *= 1 - min(bet, 0.75 / (1 - m)) * (x - m)
            ok = ok and up < 40 and down < 40
        if ok:
            accepted.append(m)
    return accepted


def test_betting_ends_match_a_brute_force_scan() -> None:
    rng = random.Random(3)
    for n in (3, 10, 40):
        values = [rng.betavariate(2, 3) for _ in range(n)]
        e = summarize_returns(values, reward_range=(0.0, 1.0))
        accepted = _brute_force(values)
        assert e.method == "betting" and accepted
        assert e.ci_low <= accepted[0] < e.ci_low + 0.002
        assert e.ci_high - 0.002 < accepted[-1] <= e.ci_high
    single = summarize_returns([0.5], reward_range=(0.0, 1.0))
    assert single.ci == (0.0, 1.0)  # one return cannot rule anything out


def test_constant_non_binary_returns_get_a_nonzero_interval() -> None:
    e = summarize_returns([0.8] * 50, reward_range=(0.0, 1.0))
    assert e.ci_low < 0.8 < e.ci_high and e.method == "betting"
