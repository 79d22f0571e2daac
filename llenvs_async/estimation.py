"""Monte Carlo estimates of V(s) and Q(s, a) with confidence intervals.

Failed rollouts are counted in ``failed`` and left out of the mean: a crashed
container says nothing about the policy's return, and averaging it in as 0 would
bias the estimate silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .runner import TrajectoryRunner
from .types import Action, State, Trajectory

__all__ = ["ValueEstimate", "estimate_q_values", "estimate_values", "summarize_returns"]

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
    """Mean return over ``n`` successful rollouts with its standard error and 95% CI."""

    mean: float
    stderr: float
    n: int
    ci_low: float
    ci_high: float
    returns: tuple[float, ...]
    failed: int = 0
    state: State | None = None
    action: Action | None = None

    @property
    def ci(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)

    def overlaps(self, other: ValueEstimate) -> bool:
        """Whether the two 95% intervals overlap."""
        return self.ci_low <= other.ci_high and other.ci_low <= self.ci_high


def summarize_returns(
    returns: Sequence[float],
    *,
    failed: int = 0,
    state: State | None = None,
    action: Action | None = None,
) -> ValueEstimate:
    """Mean, standard error and Student-t 95% interval of ``returns`` (NaN when empty)."""
    n = len(returns)
    if n == 0:
        nan = math.nan
        return ValueEstimate(
            mean=nan, stderr=nan, n=0, ci_low=nan, ci_high=nan, returns=(), failed=failed,
            state=state, action=action,
        )  # fmt: skip
    mean = math.fsum(returns) / n
    if n == 1:
        stderr, half = math.inf, math.inf
    else:
        var = math.fsum((r - mean) ** 2 for r in returns) / (n - 1)
        stderr = math.sqrt(var / n)
        half = _t95(n - 1) * stderr
    return ValueEstimate(
        mean=mean, stderr=stderr, n=n, ci_low=mean - half, ci_high=mean + half,
        returns=tuple(returns), failed=failed, state=state, action=action,
    )  # fmt: skip


def _summarize(
    trajectories: Sequence[Trajectory], gamma: float, state: State, action: Action | None
) -> ValueEstimate:
    ok = [t.discounted_return(gamma) for t in trajectories if t.error is None]
    return summarize_returns(ok, failed=len(trajectories) - len(ok), state=state, action=action)


def _check(num_rollouts: int, gamma: float) -> None:
    if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int) or num_rollouts < 1:
        raise ValueError(f"num_rollouts must be an int >= 1, got {num_rollouts!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")


async def estimate_values(
    runner: TrajectoryRunner,
    states: Sequence[State],
    num_rollouts: int,
    batch_size: int | None = None,
    gamma: float = 1.0,
) -> list[ValueEstimate]:
    """V(s) for each state: ``num_rollouts`` policy rollouts from it, in one batched run."""
    _check(num_rollouts, gamma)
    states = list(states)
    if not states:
        raise ValueError("states is empty: nothing to estimate")
    expanded = [s for s in states for _ in range(num_rollouts)]
    trajs = await runner.run_batch_from_states(expanded, batch_size=batch_size)
    return [
        _summarize(trajs[i * num_rollouts : (i + 1) * num_rollouts], gamma, s, None)
        for i, s in enumerate(states)
    ]


async def estimate_q_values(
    runner: TrajectoryRunner,
    state: State,
    actions: Sequence[Action | str],
    num_rollouts: int,
    batch_size: int | None = None,
    gamma: float = 1.0,
) -> list[ValueEstimate]:
    """Q(s, a) for each candidate action: rollouts whose first action is forced to ``a``."""
    _check(num_rollouts, gamma)
    forced = [a if isinstance(a, Action) else Action(text=a) for a in actions]
    if not forced:
        raise ValueError("actions is empty: nothing to estimate")
    expanded = [a for a in forced for _ in range(num_rollouts)]
    trajs = await runner.run_batch_from_state_actions(
        [state] * len(expanded), expanded, batch_size=batch_size
    )
    return [
        _summarize(trajs[i * num_rollouts : (i + 1) * num_rollouts], gamma, state, a)
        for i, a in enumerate(forced)
    ]
