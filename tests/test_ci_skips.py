"""The suite's rule (tests/conftest.py): under ``CI=true`` every skip fails, but a skip
of the opt-in ``gpu`` tier and an expected failure stay what they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = """
import pytest

def test_skipped_in_body():
    pytest.skip("no engine here")

@pytest.fixture
def needs_engine():
    pytest.skip("no engine for the fixture")

def test_skipped_in_fixture(needs_engine):
    pass

@pytest.mark.skipif(True, reason="marked away")
def test_skipif():
    pass

@pytest.mark.gpu
def test_gpu_may_skip():
    pytest.skip("no GPU")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False

def test_passes():
    pass
"""
MODULE_SKIP = 'import pytest\npytest.importorskip("surely_not_installed_pkg")\n'


def run_suite(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n"
        "__all__ = ['pytest_make_collect_report', 'pytest_runtest_makereport']\n"
    )
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-m", ""]
    argv += ["--continue-on-collection-errors", "-o", "markers=gpu: the opt-in tier"]
    done = subprocess.run(
        [*argv, "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    return done.stdout + done.stderr


def test_locally_skips_stay_skips(tmp_path: Path) -> None:
    out = run_suite(tmp_path, None)
    assert "1 passed, 5 skipped, 1 xfailed" in out, out


@pytest.mark.parametrize("value", ["true", "1"])
def test_under_ci_every_skip_but_gpu_fails(tmp_path: Path, value: str) -> None:
    out = run_suite(tmp_path, value)
    # A skip in a test body fails it; one in setup (a fixture, a skipif) is an error.
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 3 errors" in out, out
    for reason in ("no engine here", "no engine for the fixture", "marked away"):
        assert f"CI=true: a skip is a failure: {reason}" in out, out
    assert "a skipped module is a failure" in out and "surely_not_installed_pkg" in out, out
