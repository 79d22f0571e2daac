"""Suite-wide rules: under ``CI=true`` a skip is a failure (the opt-in ``gpu`` tier aside),
and every process the suite starts carries its owner mark.

Tests and fixtures say ``pytest.skip(reason)`` / ``pytest.importorskip(...)`` when something
they need is missing; locally that skips, in CI this hook turns it into a failure naming
the reason, so a tier that cannot run is never reported as passing.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from llenvs_async.backends._vllm_orphans import marked_engine_start
from tests._support import in_ci


@pytest.fixture(scope="session", autouse=True)
def _owner_marked_processes() -> Iterator[None]:
    """Engines, servers and examples the suite starts carry this session's owner mark, so
    ``llenvs-async cleanup`` ends what a killed run left (a fixture's own ``AsyncLLM`` or
    ``vllm serve`` included, not only engines built through the backend)."""
    with marked_engine_start():
        yield


def _reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and in_ci()
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("gpu") is None
    ):
        report.outcome = "failed"
        report.longrepr = f"CI=true: a skip is a failure: {_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"CI=true: a skipped module is a failure: {_reason(report.longrepr)}"
