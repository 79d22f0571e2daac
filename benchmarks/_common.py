"""Shared benchmark plumbing: machine facts, repeat statistics, targets, result files, plots."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llenvs_async

__all__ = [
    "RESULTS_DIR",
    "Result",
    "Target",
    "bench_main",
    "result_markdown",
    "fmt",
    "fmt_spread",
    "machine_info",
    "make_result",
    "plot",
    "render_plots",
    "spread",
    "table",
    "write_result",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
Result = dict[str, Any]


def machine_info() -> dict[str, Any]:
    """Cores, Python, platform and Docker engine version of the machine running a benchmark."""
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "docker": docker_version(),
        "load_1m_at_end": round(os.getloadavg()[0], 2),
        "llenvs_async": llenvs_async.__version__,
    }


def docker_version() -> str | None:
    """The Docker engine's server version, or ``None`` when no engine answers."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def spread(samples: Sequence[float]) -> dict[str, float]:
    """min / median / max (and n) of repeated measurements."""
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "n": len(samples),
    }


def fmt(value: Any) -> str:
    """A table cell: three significant digits, thousands as whole numbers."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def fmt_spread(stats: Mapping[str, float]) -> str:
    """``median (min-max)`` of a ``spread`` result."""
    return f"{fmt(stats['median'])} ({fmt(stats['min'])}-{fmt(stats['max'])})"


@dataclass(frozen=True, slots=True)
class Target:
    """A stated goal and the measured value it is judged on."""

    name: str
    value: float
    limit: float
    op: Literal["<=", ">="]
    unit: str = ""
    basis: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "op": self.op,
            "unit": self.unit,
            "basis": self.basis,
            "met": self.met,
        }


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A titled table for RESULTS.md; every row has one cell per column."""
    assert all(len(row) == len(columns) for row in rows), f"ragged table {title!r}"
    return {"title": title, "columns": list(columns), "rows": [list(row) for row in rows]}


def plot(
    file: str,
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    logx: bool = False,
    logy: bool = False,
) -> dict[str, Any]:
    """A line-plot spec (one line per series); ``render_plots`` draws it to ``file``."""
    return {
        "file": file,
        "title": title,
        "xlabel": xlabel,
        "ylabel": ylabel,
        "series": {label: [list(point) for point in points] for label, points in series.items()},
        "logx": logx,
        "logy": logy,
    }


def make_result(
    name: str,
    *,
    params: Mapping[str, Any],
    tables: Sequence[dict[str, Any]],
    targets: Sequence[Target],
    plots: Sequence[dict[str, Any]] = (),
    notes: Sequence[str] = (),
    data: Mapping[str, Any] | None = None,
) -> Result:
    """One benchmark's JSON document: machine, parameters, tables, targets, plots, raw data."""
    return {
        "benchmark": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "params": dict(params),
        "targets": [t.to_dict() for t in targets],
        "tables": list(tables),
        "plots": list(plots),
        "notes": list(notes),
        "data": dict(data or {}),
    }


def write_result(result: Result, out_dir: Path) -> Path:
    """Write ``<out_dir>/<benchmark>.json`` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['benchmark']}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return path


def render_plots(result: Result, out_dir: Path) -> list[Path]:
    """Draw every plot spec of ``result`` as a PNG in ``out_dir``; none without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    for spec in result["plots"]:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for label, points in spec["series"].items():
            xs, ys = zip(*points, strict=True) if points else ((), ())
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=spec["title"], xlabel=spec["xlabel"], ylabel=spec["ylabel"])
        if spec["logx"]:
            ax.set_xscale("log", base=2)
        if spec["logy"]:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / spec["file"]
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def result_markdown(result: Result) -> str:
    """One benchmark's own report: machine, tables, targets (met or not), notes, parameters."""
    machine = result["machine"]
    lines = [
        f"# {result['benchmark']}",
        "",
        f"{result['created']}; {machine['cores']} cores, Python {machine['python']}, "
        f"Docker {machine['docker']}, {machine['platform']}; load average at the end "
        f"{machine.get('load_1m_at_end', '?')}; ran {result.get('elapsed_s', '?')} s.",
        "",
    ]
    for spec in result["tables"]:
        lines += [f"## {spec['title']}", "", "| " + " | ".join(spec["columns"]) + " |"]
        lines.append("|" + "---|" * len(spec["columns"]))
        lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in spec["rows"]]
        lines.append("")
    lines += ["## Targets", ""]
    for t in result["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        value = f"{t['value']:.3g} {t['unit']}".rstrip()
        lines.append(f"- {t['name']}: {value} ({t['op']} {t['limit']}): {verdict}")
    lines += ["", "## Notes", "", *[f"- {note}" for note in result["notes"]], ""]
    lines += ["## Parameters", "", f"`{json.dumps(result['params'])}`", ""]
    return "\n".join(lines)


def bench_main(run: Callable[[bool], Result], argv: Sequence[str] | None = None) -> Result:
    """Command line of one benchmark: ``[--quick] [--out DIR]``; writes its JSON, its
    markdown report and its plots."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = run(args.quick)
    result["elapsed_s"] = round(time.perf_counter() - started, 2)
    path = write_result(result, args.out)
    (args.out / f"{result['benchmark']}.md").write_text(result_markdown(result))
    render_plots(result, args.out)
    for target in result["targets"]:
        verdict = "MET" if target["met"] else "NOT MET"
        print(f"{target['name']}: {target['value']:.4g} {target['op']} {target['limit']} {verdict}")
    print(f"wrote {path} in {result['elapsed_s']} s")
    return result
