"""Monte Carlo estimates of V(s) and Q(s, a) with 95% intervals that respect the reward range.

The interval depends on what the returns can be (``reward_range=(lo, hi)``, the range of one
rollout's discounted return; default: the environment's ``reward_range`` attribute):

- ``"wilson"``: every return is ``lo`` or ``hi`` (success/failure). Wilson score interval on
  the rescaled success rate, with Brown-Cai-DasGupta's correction near 0 and n; inside
  ``[lo, hi]``, never zero-width (0/16 gives [0, 0.19]).
  Chosen from the returns themselves, so declare the range the returns can really take.
- ``"betting"``: any other bounded returns. Waudby-Smith & Ramdas' hedged-capital interval
  (betting martingales, Ville's inequality): finite-sample coverage >= 95% for every
  distribution on ``[lo, hi]``, inside ``[lo, hi]``, never zero-width. Measured on Beta
  returns: 1.8x the (invalid at small n) Student-t width at n = 20, 1.3x at n = 200, and
  0.65x / 0.4x the width of Anderson's DKW bound there.
- ``"student-t"``: only when a bound is infinite (``reward_range=(-inf, inf)``, asked for
  explicitly): the asymptotic t interval, clipped to the finite bound. Approximate: it can
  under-cover for small n and is zero-width when every return is equal.

An unknown range is an error: no finite-sample interval exists without one.
How failed rollouts count is explicit (``failures``); ``failed`` always reports how many failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal, get_args

from .env import AgentSurface
from .errors import EstimationError, RolloutsFailedError
from .runner import TrajectoryRunner
from .types import Action, State, Trajectory

__all__ = [
    "Failures",
    "Method",
    "ValueEstimate",
    "estimate_q_values",
    "estimate_values",
    "summarize_returns",
]

Failures = Literal["exclude", "zero", "raise"]
"""``exclude``: leave failed rollouts out of the mean (``n`` counts the others);
``zero``: count each as return 0.0 (0 must lie in the range); ``raise``: raise
``RolloutsFailedError`` if any rollout failed."""

Method = Literal["wilson", "betting", "student-t", "none"]
"""How the interval was computed (``none``: no returns; the interval is the whole range)."""

CONFIDENCE = 0.95
_ALPHA = 1.0 - CONFIDENCE
_Z = NormalDist().inv_cdf(1.0 - _ALPHA / 2)
# Returns within this fraction of the range of a bound count as on it (float sums).
_TOLERANCE = 1e-9

# Two-sided 95% Student-t critical values by degrees of freedom (1..30), then coarser.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t95(df: int) -> float:
    if df <= 30:
        return _T95[df - 1]
    if df <= 60:
        return 2.000
    if df <= 120:
        return 1.980
    return 1.960


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueEstimate:
    """Mean return over ``n`` rollouts with its standard error and 95% interval.

    ``returns`` are the values the estimate used (with ``failures="zero"``, a 0.0 per
    failed rollout); ``failed`` counts failed rollouts however they were treated.
    ``trajectories`` are the rollouts it was computed from, failed ones included, in order
    (the batch already held them; not part of ``==`` or ``repr``).
    """

    mean: float
    stderr: float
    n: int
    ci_low: float
    ci_high: float
    returns: tuple[float, ...]
    failed: int = 0
    state: State | None = None
    action: Action | None = None
    method: Method = "student-t"
    reward_range: tuple[float, float] | None = None
    trajectories: tuple[Trajectory, ...] = field(default=(), compare=False, repr=False)

    @property
    def ci(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)

    def overlaps(self, other: ValueEstimate) -> bool:
        """Whether the two 95% intervals overlap."""
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high


def summarize_returns(
    returns: Sequence[float],
    *,
    reward_range: tuple[float, float],
    failed: int = 0,
    state: State | None = None,
    action: Action | None = None,
    trajectories: Sequence[Trajectory] = (),
) -> ValueEstimate:
    """Mean, standard error and 95% interval of ``returns``, each within ``reward_range``.

    The method is chosen as the module docstring says. Empty ``returns``: NaN mean and the
    whole range as the interval (NaN when the range is unbounded).
    """
    lo, hi = _check_range(reward_range, "reward_range")
    values = tuple(_within(float(r), i, lo, hi) for i, r in enumerate(returns))
    mean, stderr, low, high, method = _interval(values, lo, hi)
    return ValueEstimate(
        mean=mean, stderr=stderr, n=len(values), ci_low=low, ci_high=high, returns=values,
        failed=failed, state=state, action=action, method=method, reward_range=(lo, hi),
        trajectories=tuple(trajectories),
    )  # fmt: skip


def _interval(
    values: Sequence[float], lo: float, hi: float
) -> tuple[float, float, float, float, Method]:
    """(mean, stderr, ci_low, ci_high, method) of returns already checked to lie in [lo, hi]."""
    n = len(values)
    bounded = math.isfinite(lo) and math.isfinite(hi)
    if n == 0:
        low, high = (lo, hi) if bounded else (math.nan, math.nan)
        return math.nan, math.nan, low, high, "none"
    mean = math.fsum(values) / n
    stderr = math.inf if n == 1 else math.sqrt(_variance(values, mean) / n)
    method: Method
    if not bounded:
        method = "student-t"
        half = math.inf if n == 1 else _t95(n - 1) * stderr
        low, high = max(mean - half, lo), min(mean + half, hi)
    elif all(r in (lo, hi) for r in values):
        method = "wilson"
        low, high = _wilson(sum(r == hi for r in values), n, lo, hi)
    else:
        method = "betting"
        low, high = _betting(values, lo, hi)
    # A superset of a valid interval is valid: widen to the sample mean where rounding (or
    # the betting interval's weighting) leaves it just outside.
    return mean, stderr, min(low, mean), max(high, mean), method


def _variance(values: Sequence[float], mean: float) -> float:
    return math.fsum((r - mean) ** 2 for r in values) / (len(values) - 1)


def _wilson(successes: int, n: int, lo: float, hi: float) -> tuple[float, float]:
    """Wilson score interval for ``successes`` of ``n``, mapped from [0, 1] to [lo, hi].

    With Brown, Cai & DasGupta's (2001) Poisson correction at 1..3 successes (or failures):
    plain Wilson's coverage dips to ~84% at p just below its bound for one success (p ~ 0.4/n,
    the hard-task regime); the correction keeps the worst case near 92% for <1.5% width.
    """
    p = successes / n
    z2 = _Z * _Z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = _Z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if successes == 0 else max(center - half, 0.0)
    high = 1.0 if successes == n else min(center + half, 1.0)
    cutoff = 2 if n <= 50 else 3
    if 1 <= successes <= cutoff:
        low = min(low, _POISSON_LOWER[successes - 1] / n)
    if 1 <= n - successes <= cutoff:
        high = max(high, 1.0 - _POISSON_LOWER[n - successes - 1] / n)
    return lo + (hi - lo) * low, lo + (hi - lo) * high


# One-sided 95% lower Poisson limits for 1, 2, 3 events: chi2(0.05; 2x) / 2.
_POISSON_LOWER = (0.051293294387550516, 0.3553615106986617, 0.817691447163953)


def _betting(values: Sequence[float], lo: float, hi: float) -> tuple[float, float]:
    """Waudby-Smith & Ramdas' (2024) hedged-capital interval for the mean on [lo, hi].

    For a candidate mean m, ``K+ = prod(1 + l_i (x_i - m))`` is the wealth of a bettor on
    "the mean is above m" (``K-`` mirrored); at the true mean both are nonnegative
    martingales, so by Ville's inequality either ever reaching 2/alpha has probability
    <= alpha/2. The interval is every m where neither does; K+ falls and K- rises with m,
    so its ends are found by bisection (rounded outwards). Bets ``l_i`` are predictable
    plug-ins from the earlier returns' variance (fixed-n tuning, capped at 3/4 of the
    most a bet can risk), so the interval depends on the order of the returns.
    """
    span = hi - lo
    x = [(r - lo) / span for r in values]
    bets = _plug_in_bets(x)
    low = _lowest_plausible(x, bets)
    high = 1.0 - _lowest_plausible([1.0 - v for v in x], bets)  # mirror: same bets
    if low >= high:  # both bettors won (at different times): rare (<= alpha); stay honest
        return lo, hi
    return lo + span * low, lo + span * high


_BET_CAP = 0.75
_BISECTIONS = 32


def _plug_in_bets(x: Sequence[float]) -> list[float]:
    """l_i = sqrt(2 log(2/alpha) / (n var_{i-1})), var from x_1..x_{i-1} (prior 1/4)."""
    n = len(x)
    bets = []
    total, squares = 0.0, 0.25
    for i, xi in enumerate(x):
        bets.append(math.sqrt(2 * math.log(2 / _ALPHA) / (n * squares / (i + 1))))
        mean_before = (0.5 + total) / (i + 1)
        total += xi
        squares += (xi - mean_before) ** 2
    return bets


def _lowest_plausible(x: Sequence[float], bets: Sequence[float]) -> float:
    """The smallest m in [0, 1] whose bettor on "mean > m" never reaches 2/alpha (rounded
    down: the returned m is the largest rejected point found, or 0)."""
    threshold = math.log(2 / _ALPHA)

    def rejected(m: float) -> bool:
        cap = _BET_CAP / m if m > 0 else math.inf
        log_wealth = 0.0
        for xi, bet in zip(x, bets, strict=True):
            log_wealth += math.log1p(min(bet, cap) * (xi - m))
            if log_wealth >= threshold:
                return True
        return False

    if not rejected(0.0):
        return 0.0
    below, above = 0.0, 1.0  # rejected(0) holds; rejected(1) never does (every factor <= 1)
    for _ in range(_BISECTIONS):
        mid = (below + above) / 2
        below, above = (mid, above) if rejected(mid) else (below, mid)
    return below


def _check_range(reward_range: object, where: str) -> tuple[float, float]:
    """``(lo, hi)`` as floats, lo < hi, no NaN; a ``ValueError`` naming ``where`` otherwise."""
    pair: Any = reward_range
    try:
        if isinstance(pair, str | bytes):
            raise TypeError(pair)
        first, second = pair
        lo, hi = float(first), float(second)
    except (TypeError, ValueError):
        message = f"{where} must be a pair (lo, hi) of numbers, got {reward_range!r}"
        raise ValueError(message) from None
    if math.isnan(lo) or math.isnan(hi) or not lo < hi:
        raise ValueError(f"{where} must be (lo, hi) with lo < hi, got {reward_range!r}")
    return lo, hi


def _within(r: float, index: int, lo: float, hi: float) -> float:
    """``r`` snapped onto a bound it is within float rounding of; an error if it is outside."""
    slack = _TOLERANCE * (hi - lo) if math.isfinite(hi - lo) else 0.0
    if math.isnan(r) or r < lo - slack or r > hi + slack:
        raise EstimationError(
            f"return {r!r} of rollout {index} is outside reward_range ({lo}, {hi}): the "
            "interval would be invalid; declare the range a rollout's return can take",
            value=r, index=index, reward_range=(lo, hi),
        )  # fmt: skip
    if abs(r - lo) <= slack:
        return lo
    if abs(r - hi) <= slack:
        return hi
    return r


def _resolve_range(
    runner: TrajectoryRunner, reward_range: tuple[float, float] | None
) -> tuple[float, float]:
    if reward_range is not None:
        return _check_range(reward_range, "reward_range")
    declared = AgentSurface.of(runner.environment).reward_range
    name = type(runner.environment).__name__
    if declared is None:
        raise EstimationError(
            f"{name} declares no reward_range and none was passed: pass reward_range=(lo, hi), "
            "the range of one rollout's return (or (-inf, inf) for an approximate Student-t "
            "interval)",
            environment=name,
        )
    return _check_range(declared, f"{name}.reward_range")


def _check(num_rollouts: int, gamma: float, failures: str) -> None:
    if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int) or num_rollouts < 1:
        raise ValueError(f"num_rollouts must be an int >= 1, got {num_rollouts!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if failures not in get_args(Failures):
        raise ValueError(f"failures must be one of {get_args(Failures)}, got {failures!r}")


def _prepare(
    runner: TrajectoryRunner,
    num_rollouts: int,
    gamma: float,
    reward_range: tuple[float, float] | None,
    failures: Failures,
) -> tuple[float, float]:
    """Every argument check, before any rollout runs."""
    _check(num_rollouts, gamma, failures)
    lo, hi = _resolve_range(runner, reward_range)
    if failures == "zero" and not lo <= 0.0 <= hi:
        raise ValueError(
            f"failures='zero' counts a failed rollout as return 0.0, outside reward_range "
            f"({lo}, {hi}); use 'exclude' or 'raise'"
        )
    return lo, hi


def _ids(first: int, count: int) -> list[int]:
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(f"first_rollout_id must be an int >= 0, got {first!r}")
    return list(range(first, first + count))


def _raise_on_failures(trajectories: Sequence[Trajectory], failures: Failures) -> None:
    bad = [t for t in trajectories if t.error is not None]
    if failures != "raise" or not bad:
        return
    first = bad[0]
    assert first.error is not None
    raise RolloutsFailedError(
        f"{len(bad)} of {len(trajectories)} rollouts failed (failures='raise'); first, rollout "
        f"{first.index}: {first.error.type}: {first.error.message}",
        failed=len(bad), total=len(trajectories), first_error=first.error,
        trajectories=tuple(trajectories),
    )  # fmt: skip


def _summarize(
    trajectories: Sequence[Trajectory],
    gamma: float,
    reward_range: tuple[float, float],
    failures: Failures,
    state: State,
    action: Action | None,
) -> ValueEstimate:
    returns = [
        t.discounted_return(gamma) if t.error is None else 0.0
        for t in trajectories
        if t.error is None or failures == "zero"
    ]
    failed = sum(t.error is not None for t in trajectories)
    return summarize_returns(
        returns, reward_range=reward_range, failed=failed, state=state, action=action,
        trajectories=trajectories,
    )  # fmt: skip


async def estimate_values(
    runner: TrajectoryRunner,
    states: Sequence[State],
    num_rollouts: int,
    batch_size: int | None = None,
    gamma: float = 1.0,
    *,
    reward_range: tuple[float, float] | None = None,
    failures: Failures = "exclude",
    first_rollout_id: int = 0,
) -> list[ValueEstimate]:
    """V(s) for each state: ``num_rollouts`` policy rollouts from it, in one batched run.

    The rollouts are numbered from ``first_rollout_id`` and their seeds follow the number
    (``run_batch``'s ``rollout_ids``): a call repeated with the same numbers repeats its
    draws, so to add independent samples, number them on."""
    lo_hi = _prepare(runner, num_rollouts, gamma, reward_range, failures)
    states = list(states)
    if not states:
        raise ValueError("states is empty: nothing to estimate")
    expanded = [s for s in states for _ in range(num_rollouts)]
    trajs = await runner.run_batch_from_states(
        expanded, batch_size=batch_size, rollout_ids=_ids(first_rollout_id, len(expanded))
    )
    _raise_on_failures(trajs, failures)
    return [
        _summarize(trajs[i * num_rollouts : (i + 1) * num_rollouts], gamma, lo_hi, failures, s,
                   None)
        for i, s in enumerate(states)
    ]  # fmt: skip


async def estimate_q_values(
    runner: TrajectoryRunner,
    state: State,
    actions: Sequence[Action | str],
    num_rollouts: int,
    batch_size: int | None = None,
    gamma: float = 1.0,
    *,
    reward_range: tuple[float, float] | None = None,
    failures: Failures = "exclude",
    first_rollout_id: int = 0,
) -> list[ValueEstimate]:
    """Q(s, a) for each candidate action: rollouts whose first action is forced to ``a``;
    ``first_rollout_id`` as in ``estimate_values``."""
    lo_hi = _prepare(runner, num_rollouts, gamma, reward_range, failures)
    forced = [a if isinstance(a, Action) else Action(text=a) for a in actions]
    if not forced:
        raise ValueError("actions is empty: nothing to estimate")
    expanded = [a for a in forced for _ in range(num_rollouts)]
    trajs = await runner.run_batch_from_state_actions(
        [state] * len(expanded), expanded, batch_size=batch_size,
        rollout_ids=_ids(first_rollout_id, len(expanded)),
    )  # fmt: skip
    _raise_on_failures(trajs, failures)
    return [
        _summarize(trajs[i * num_rollouts : (i + 1) * num_rollouts], gamma, lo_hi, failures,
                   state, a)
        for i, a in enumerate(forced)
    ]  # fmt: skip
