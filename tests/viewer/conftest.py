"""Fixtures for the browser tier: real headless Chromium (Debian's chromium + chromedriver).

A test asking for ``browser`` gets the ``browser`` marker. No chromium/chromedriver: skipped
locally, FAILED in CI (``CI=true``); ``scripts/ensure-chromium.sh`` installs them. The
generated files come from the CLI itself (``run`` and ``q-values`` on the counter env).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.cli import _sources, main
from llenvs_async.envs import CounterEnv

from ..cli._docker import docker_ready  # noqa: F401  (a fixture)
from ._browser import CHROMEDRIVER, CHROMIUM, find, start_chromium


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the session, with a fresh profile directory."""
    missing = [names[-1] for names in (CHROMIUM, CHROMEDRIVER) if find(names) is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        pytest.skip(f"missing {', '.join(missing)}; run scripts/ensure-chromium.sh")
    driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


@dataclass(frozen=True, slots=True)
class Generated:
    runs: Path  # results JSONL of `run` (some rollouts failed)
    values0: Path  # `q-values --json` at step 0 (Q(s, dec): every rollout failed)
    values1: Path  # `q-values --json` at step 1, nested under step 0's states
    rollouts0: Path  # `q-values --trajectories` of values0: the rollouts behind each estimate
    rollouts1: Path  # and of values1

    def estimates(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for path in (self.values0, self.values1):
            rows.extend(json.loads(path.read_text()))
        return rows


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """Files written by the CLI on the counter env, where every ``dec`` crashes the env."""
    d = tmp_path_factory.mktemp("generated")
    out = Generated(*(d / n for n in ("runs.jsonl", "q0.json", "q1.json", "t0.jsonl", "t1.jsonl")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_sources, "CounterEnv", functools.partial(CounterEnv, fail_on="dec"))
        run = ["run", "--env", "counter", "-n", "4", "--epsilon", "0.4", "--seed", "3"]
        assert main([*run, "-o", str(out.runs), "-q"]) == 0
        q = ["q-values", str(out.runs), "-n", "6", "--epsilon", "0.3", "--max-states", "2"]
        plot = ["--plot", str(d / "q.png")]
        q0 = ["--json", str(out.values0), "--trajectories", str(out.rollouts0)]
        assert main([*q, "--step", "0", "-a", "dec", *q0, *plot]) == 0
        q1 = ["--json", str(out.values1), "--trajectories", str(out.rollouts1)]
        assert main([*q, "--step", "1", *q1, *plot]) == 0
    return out
