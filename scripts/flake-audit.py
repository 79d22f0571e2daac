"""Run test tiers repeatedly on a loaded machine and tabulate what failed.

    .venv/bin/python scripts/flake-audit.py --runs 5 --tier docker --tier gvisor
    .venv/bin/python scripts/flake-audit.py --runs 5 --tier all --out flake_audit.md
    .venv/bin/python scripts/flake-audit.py --runs 5 --path tests/docker/test_limits.py ...

A CPU burner (one busy process per core) runs for the whole audit, so timing windows that
only hold on a quiet machine show up. Each run is a fresh pytest process with CI=true
(a skip fails). The table lists, per tier, how many runs failed and which tests failed.
``--path`` runs the given test files (every marker) as one more row.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HEAVY = ("docker", "vllm", "ray", "gvisor", "browser", "trainers", "standards")
TIERS = {
    "fast": " and ".join(f"not {m}" for m in _HEAVY),
    "docker": "docker and not vllm and not ray and not gvisor",
    "gvisor": "gvisor",
    "vllm": "vllm",
    "ray": "ray",
    "browser": "browser",
    "trainers": "trainers",
    "standards": "standards",
}
_INTERRUPT_WAIT = 120.0  # for pytest's teardown after SIGINT
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def burn(stop_at: float) -> None:
    """Keep one core busy until ``stop_at`` (a wall-clock bound: never left running)."""
    while time.time() < stop_at:
        pass


def run_tier(selection: list[str], timeout: float) -> tuple[int, list[str], float, str]:
    """One fresh pytest run of ``selection``: exit code, failed tests, seconds, output."""
    started = time.monotonic()
    code, output = finish(start_pytest(selection), timeout)
    return code, sorted(set(_FAILED.findall(output))), time.monotonic() - started, output


def start_pytest(selection: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "CI": "true"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """The run's exit code and output. Past ``timeout``, or when the audit itself is
    interrupted, it is interrupted as Ctrl-C would (its fixtures tear down; code -1), and
    killed if that takes over ``_INTERRUPT_WAIT``. (The test suite's ``run_child`` does
    the same inside a test, where the outcome is a ``pytest.fail``.)"""
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except BaseException as exc:
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=_INTERRUPT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return -1, f"{output}\n(timed out after {timeout:.0f} s)"


def reap_leftovers() -> list[str]:
    """What the finished run left (containers, sandboxes, images, engine processes),
    removed by ``llenvs-async cleanup`` (its owner is gone): one leak would load, and
    fail, every later run."""
    cli = Path(sys.executable).parent / "llenvs-async"
    done = subprocess.run([cli, "cleanup"], capture_output=True, text=True, timeout=600)
    lines = (done.stdout + done.stderr).splitlines()
    return [line for line in lines if line.startswith(("removed", "ended"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tier", action="append", choices=[*TIERS, "all"], default=[])
    parser.add_argument(
        "--path", action="extend", nargs="+", default=[], help="test files: one row"
    )
    parser.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    parser.add_argument("--no-load", action="store_true", help="no CPU burner")
    parser.add_argument("--out", type=Path, help="append the markdown table to this file")
    parser.add_argument("--logs", type=Path, help="keep each failed run's pytest output here")
    args = parser.parse_args()
    if not args.tier and not args.path:
        parser.error("give --tier and/or --path")
    selections = {t: ["-m", TIERS[t]] for t in (list(TIERS) if "all" in args.tier else args.tier)}
    if args.path:
        selections["listed files"] = args.path
    burners: list[multiprocessing.Process] = []
    if not args.no_load:
        stop_at = time.time() + args.timeout * args.runs * len(selections)
        burners = [
            multiprocessing.Process(target=burn, args=(stop_at,), daemon=True)
            for _ in range(os.cpu_count() or 1)
        ]
        for burner in burners:
            burner.start()
    rows = []
    try:
        for tier, selection in selections.items():
            failures: Counter[str] = Counter()
            failed_runs, seconds, left = 0, [], []
            for i in range(args.runs):
                code, failed, took, output = run_tier(selection, args.timeout)
                leaked = reap_leftovers()
                left += leaked
                output += "".join(f"\nleft behind: {line}" for line in leaked)
                if code != 0 and args.logs is not None:  # the reasons, not only the names
                    args.logs.mkdir(parents=True, exist_ok=True)
                    name = f"{tier.replace(' ', '-')}-run{i + 1}.log"
                    (args.logs / name).write_text(output)
                failed_runs += code != 0
                failures.update(failed or ([] if code == 0 else [f"exit {code}"]))
                seconds.append(took)
                print(
                    f"{tier} run {i + 1}/{args.runs}: exit {code} in {took:.0f} s {failed}"
                    + "".join(f"; left behind: {line}" for line in leaked),
                    flush=True,
                )
            names = ", ".join(f"{n} ({c}x)" for n, c in failures.most_common()) or "-"
            rows.append(
                f"| {tier} | {args.runs} | {failed_runs} | {max(seconds):.0f} s | {names} "
                f"| {'; '.join(left) or '-'} |"
            )
    finally:
        for burner in burners:
            burner.terminate()
            burner.join()
    load = "no load" if args.no_load else f"{len(burners)} busy processes"
    listed = f"\n\nListed files: {', '.join(args.path)}" if args.path else ""
    table = "\n".join(
        [
            f"Flake audit {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {load}, CI=true"
            + listed,
            "",
            "| tier | runs | failed runs | slowest run | failing tests | left behind |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if args.out:
        with args.out.open("a") as out:
            out.write(table + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
