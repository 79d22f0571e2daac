"""validate-replay, cleanup, images build-base and bench."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

import llenvs_async.cli.bench as bench_module

from ._docker import containers_of
from .conftest import CLI, EXAMPLE_TASKS, Invoke


def test_bench_runs_the_suite_with_extra_arguments(
    cli: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "run_all.py").write_text(
        "import sys\nopen('ran.txt', 'w').write(' '.join(sys.argv[1:]))\nsys.exit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    res = cli("bench", "--quick", "x")
    assert (tmp_path / "ran.txt").read_text() == "--quick x"
    assert res.code == 3  # the suite's exit status is passed on


def test_bench_without_a_suite_is_one_line(cli: Invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_module, "find_benchmarks", lambda: None)
    res = cli("bench")
    assert res.code == 1
    assert res.err.strip().startswith("error: no benchmarks/run_all.py")


@pytest.mark.docker
@pytest.mark.slow
def test_validate_replay_tells_deterministic_from_random_tasks(
    cli: Invoke, tmp_path: Path, docker_ready: None
) -> None:
    report = tmp_path / "r.json"
    res = cli("validate-replay", str(EXAMPLE_TASKS), "-t", "json-config", "--json", str(report))
    assert res.code == 0, res.err
    assert "consistent" in res.out and "NOT" not in res.out
    assert json.loads(report.read_text())["consistent"] is True
    res = cli("validate-replay", str(EXAMPLE_TASKS), "-t", "random-session", "--trials", "2")
    assert res.code == 1
    assert "NOT consistent" in res.out
    assert "token.txt" in res.out  # the diff names what differs


@pytest.mark.docker
@pytest.mark.slow
async def test_cleanup_removes_the_containers_of_a_killed_run(
    cli: Invoke, tmp_path: Path, docker_ready: None
) -> None:
    out = tmp_path / "h.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *CLI, "run", str(EXAMPLE_TASKS), "-n", "2", "-c", "2", "-o", str(out), "-q",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with asyncio.timeout(120):
            while not await containers_of(proc.pid):
                assert proc.returncode is None
                await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # no teardown, no atexit: orphans
        await proc.wait()
    orphans = await containers_of(proc.pid)
    assert orphans
    res = await asyncio.to_thread(cli, "cleanup")
    assert res.code == 0, res.err
    assert await containers_of(proc.pid) == []
    assert orphans[0][:12] in res.out


@pytest.mark.docker
def test_images_build_base_reuses_the_existing_image(cli: Invoke, docker_ready: None) -> None:
    res = cli("images", "build-base")
    assert res.code == 0, res.err
    assert "llenvs/base:bookworm" in res.out and "debian:bookworm-slim" in res.out
