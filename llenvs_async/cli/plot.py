"""A PNG of V/Q estimates with their 95% confidence intervals (needs matplotlib, optional)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..estimation import ValueEstimate

__all__ = ["EstimatePanel", "matplotlib_available", "plot_estimates"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimatePanel:
    """One state's estimates: ``rows`` are (label, estimate), drawn top to bottom."""

    title: str
    rows: Sequence[tuple[str, ValueEstimate]]


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_estimates(panels: Sequence[EstimatePanel], path: Path) -> None:
    """One horizontal error-bar panel per state: mean and 95% CI of each estimate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [max(1.2, 0.45 * len(p.rows) + 0.8) for p in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8, sum(heights)), squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for y, (label, est) in enumerate(reversed(panel.rows)):
            if not math.isfinite(est.mean):
                continue  # every rollout failed: nothing to draw
            low = est.ci_low if math.isfinite(est.ci_low) else est.mean
            high = est.ci_high if math.isfinite(est.ci_high) else est.mean
            color = "tab:blue" if label.startswith("V") else "tab:orange"
            ax.errorbar(
                est.mean, y, xerr=[[est.mean - low], [high - est.mean]], fmt="o", color=color,
                capsize=4,
            )  # fmt: skip
        ax.set_yticks(range(len(panel.rows)), [_short(r[0]) for r in reversed(panel.rows)])
        ax.set_xlim(*_limits(panels))
        ax.set_ylim(-0.6, len(panel.rows) - 0.4)
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("estimated return (mean, 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _limits(panels: Sequence[EstimatePanel]) -> tuple[float, float]:
    """A shared x range: at least [0, 1], widened to every finite interval end."""
    ends = [
        v
        for p in panels
        for _, e in p.rows
        for v in (e.mean, e.ci_low, e.ci_high)
        if math.isfinite(v)
    ]
    low, high = min([0.0, *ends]), max([1.0, *ends])
    pad = 0.05 * (high - low)
    return low - pad, high + pad


def _short(label: str, width: int = 48) -> str:
    """Truncated, with ``$`` escaped (matplotlib would read ``$...$`` as math)."""
    text = label if len(label) <= width else label[: width - 1] + "…"
    return text.replace("$", r"\$")
