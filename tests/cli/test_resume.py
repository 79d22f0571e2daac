from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.cli._results import load_results, unique_by_key
from llenvs_async.cli.run import journal_path
from llenvs_async.serialization import read_journal, read_jsonl, read_trajectories
from llenvs_async.testing.openai_server import Fault, OpenAITestServer, serve_openai_compatible

from ._docker import containers_of
from .conftest import CLI, EXAMPLE_TASKS, Invoke

ALL_KEYS = [(t, r) for t in range(5) for r in range(2)]
BLOCK_AFTER = 14  # chat requests answered before the fake model hangs (two chunks' worth)


def _keys(path: Path) -> list[tuple[Any, int]]:
    return [(r["key"]["task"], r["key"]["rollout"]) for r in read_jsonl(path)]


def _mid_episode(out: Path) -> bool:
    """Whether the step journal holds a step of a rollout the results file does not."""
    done = set(_keys(out))
    return any((k[0], k[1]) not in done for k in read_journal(journal_path(out)))


def _complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def test_sigint_mid_run_then_resume_loses_and_duplicates_nothing(
    tmp_path: Path, cli: Invoke
) -> None:
    out = tmp_path / "r.jsonl"
    calls = 0
    server: OpenAITestServer

    def policy(messages: Any) -> str:
        # After BLOCK_AFTER answers every later request hangs: the child is then provably
        # mid-run (a lockstep round waits on the model) when it gets SIGINT.
        nonlocal calls
        calls += 1
        if calls == BLOCK_AFTER:
            server.inject(Fault.delayed(3600, times=10**6))
        return "right"

    async with serve_openai_compatible(policy=policy) as server:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "run", "--env", "chain", "-n", "2", "-c", "2", "-o", str(out), "-q",
            "--backend", "openai", "--model", "fake-model", "--base-url", server.base_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(60):
                while not (server.in_flight >= 1 and _complete_lines(out) >= 1):
                    assert proc.returncode is None, await proc.stderr.read()  # type: ignore[union-attr]
                    await asyncio.sleep(0.02)
            saved = out.read_bytes()
            proc.send_signal(signal.SIGINT)
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr
    assert b"--resume" in stderr
    assert b"(interrupted)" in stdout  # the summary table still comes out
    # Nothing half-written, nothing lost: the file holds exactly what was saved before.
    assert out.read_bytes() == saved
    before = _keys(out)
    assert 1 <= len(before) < len(ALL_KEYS)
    assert len(set(before)) == len(before)

    args = ("run", "--env", "chain", "-n", "2", "-c", "2", "-o", str(out), "--resume", "-q")
    res = await asyncio.to_thread(cli, *args)  # the CLI runs its own event loop
    assert res.code == 0, res.err
    assert out.read_bytes().startswith(saved)
    after = _keys(out)
    assert sorted(after) == ALL_KEYS  # every (task, rollout) exactly once
    assert f"wrote {len(ALL_KEYS) - len(before)} trajectories" in res.out
    assert all(t.success for t in read_trajectories(out))


async def test_sigkill_mid_episode_then_resume_continues_each_cut_rollout_from_its_last_step(
    tmp_path: Path, cli: Invoke
) -> None:
    """A kill -9 while rollouts are mid-episode: the resumed run continues each from the
    last step its journal holds (asking the model only for the steps left: none lost,
    none taken twice), and removes the journal once every rollout is written."""
    out = tmp_path / "r.jsonl"
    journal = journal_path(out)
    calls = 0
    server: OpenAITestServer

    def policy(messages: Any) -> str:
        nonlocal calls
        calls += 1
        if calls == BLOCK_AFTER + 3:  # tasks 0 and 1 done, task 2's rollouts a step in
            server.inject(Fault.delayed(3600, times=10**6))
        return "right"

    run = ("run", "--env", "chain", "-n", "2", "-c", "2", "-o", str(out), "-q",
           "--backend", "openai", "--model", "fake-model")  # fmt: skip
    async with serve_openai_compatible(policy=policy) as server:
        proc = await asyncio.create_subprocess_exec(
            *CLI, *run, "--base-url", server.base_url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(60):
                while server.in_flight < 1 or calls < BLOCK_AFTER + 3:
                    assert proc.returncode is None, await proc.stderr.read()  # type: ignore[union-attr]
                    await asyncio.sleep(0.02)
            proc.kill()  # no teardown, no flush beyond what each step already did
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    done = set(_keys(out))
    cut = {k: t for k, t in read_journal(journal).items() if (k[0], k[1]) not in done}
    assert cut and all(len(t) >= 1 for t in cut.values()), cut  # caught mid-episode

    asked = 0

    def count(messages: Any) -> str:
        nonlocal asked
        asked += 1
        return "right"

    async with serve_openai_compatible(policy=count) as again:
        res = await asyncio.to_thread(cli, *run, "--base-url", again.base_url, "--resume")
    assert res.code == 0, res.err
    assert sorted(_keys(out)) == ALL_KEYS
    records = {r.key: r.trajectory for r in unique_by_key(load_results(out))}
    resumed = {k: t for k, t in records.items() if "resumed_at_step" in t.info}
    assert set(resumed) == {(k[0], k[1]) for k in cut}
    for key, t in resumed.items():
        journaled = cut[key]
        assert t.info["resumed_at_step"] == len(journaled)
        assert t.transitions[: len(journaled)] == journaled.transitions
        assert t.success
    fresh = set(ALL_KEYS) - done - set(resumed)
    steps_left = sum(len(records[k]) for k in fresh) + sum(
        len(t) - len(cut[k]) for k, t in resumed.items()
    )
    assert asked == steps_left  # the journaled steps were not asked for again
    assert not journal.exists()


def _runs(path: Path) -> dict[tuple[Any, int], tuple[tuple[str, ...], float]]:
    """Each (task, rollout)'s actions and return."""
    return {
        r.key: (tuple(a.text for a in r.trajectory.actions), r.trajectory.total_reward)
        for r in unique_by_key(load_results(path))
    }


def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(tmp_path: Path, cli: Invoke) -> None:
    # A kill catches some rollouts mid-episode: the file then holds an arbitrary subset of
    # the keys, and the resumed run must give the rest the draws they had in the full run.
    args = ("--env", "chain", "--limit", "3", "-n", "6", "-c", "3", "--epsilon", "0.4",
            "--seed", "11", "-q")  # fmt: skip
    full, cut = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    assert cli("run", *args, "-o", str(full)).code == 0
    lines = full.read_text().splitlines(keepends=True)
    assert len(lines) == 18
    cut.write_text("".join(line for i, line in enumerate(lines) if i % 3 != 1))
    res = cli("run", *args, "-o", str(cut), "--resume")
    assert res.code == 0, res.err
    assert "wrote 6 trajectories" in res.out
    expected = _runs(full)
    assert len({actions for actions, _ in expected.values()}) > 3  # the draws do differ
    assert _runs(cut) == expected


def test_resume_reruns_a_record_cut_mid_line(tmp_path: Path, cli: Invoke) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "chain", "-n", "2", "-o", str(out), "-q").code == 0
    full = out.read_bytes()
    out.write_bytes(full[:-40])  # the writer died in the middle of the last line
    res = cli("run", "--env", "chain", "-n", "2", "-o", str(out), "--resume", "-q")
    assert res.code == 0, res.err
    assert "wrote 1 trajectories" in res.out
    assert sorted(_keys(out)) == ALL_KEYS


def test_resume_with_nothing_left_writes_nothing(tmp_path: Path, cli: Invoke) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "arithmetic", "--limit", "3", "-o", str(out), "-q").code == 0
    before = out.read_bytes()
    res = cli("run", "--env", "arithmetic", "--limit", "3", "-o", str(out), "--resume", "-q")
    assert res.code == 0
    assert "wrote 0 trajectories" in res.out
    assert out.read_bytes() == before


def test_retry_failed_reruns_only_failed_rollouts(tmp_path: Path, cli: Invoke) -> None:
    out = tmp_path / "r.jsonl"
    # Mark one saved rollout as failed by hand at its third step: only that one may be
    # rerun, and it continues from the two steps it had recorded.
    assert cli("run", "--env", "chain", "--limit", "2", "-o", str(out), "-q").code == 0
    lines = out.read_text().splitlines()
    record = json.loads(lines[0])
    whole = record["trajectory"]["transitions"]
    assert len(whole) > 2
    record["trajectory"].update(
        transitions=whole[:2], stop_reason="error",
        error={"type": "EnvError", "message": "boom", "phase": "step", "traceback": ""},
    )  # fmt: skip
    out.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    res = cli("run", "--env", "chain", "--limit", "2", "-o", str(out), "--resume", "--retry-failed",
              "-q")  # fmt: skip
    assert res.code == 0, res.err
    assert "wrote 1 trajectories" in res.out
    assert len(_keys(out)) == 3  # the retry is appended; readers keep the last per key
    retried = read_trajectories(out)[-1]
    assert retried.error is None and retried.success
    assert retried.info["resumed_at_step"] == 2 and len(retried) == len(whole)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_sigint_on_harbor_run_leaves_no_container_and_resumes(
    tmp_path: Path, cli: Invoke, docker_ready: None, signum: int
) -> None:
    out = tmp_path / "h.jsonl"
    args = ("run", str(EXAMPLE_TASKS), "-n", "2", "-c", "2", "-o", str(out), "-q")
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        # Interrupt once a trajectory is saved while the next chunk's containers are live.
        async with asyncio.timeout(120):
            while not (_complete_lines(out) >= 1 and await containers_of(proc.pid)):
                assert proc.returncode is None
                await asyncio.sleep(0.02)
        proc.send_signal(signum)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert await containers_of(proc.pid) == []
    before = _keys(out)
    assert 1 <= len(before) < 14
    res = await asyncio.to_thread(cli, *args, "--resume")
    assert res.code == 0, res.err
    after = _keys(out)
    assert after[: len(before)] == before
    tasks = {task for task, _ in after}
    assert len(tasks) == 7
    assert sorted(after) == sorted((task, r) for task in tasks for r in (0, 1))


@pytest.mark.docker
@pytest.mark.slow
async def test_sigkill_mid_container_run_then_resume_equals_the_uninterrupted_run(
    tmp_path: Path, cli: Invoke, docker_ready: None
) -> None:
    # The shape: a seeded epsilon oracle over three container tasks, killed -9 while
    # rollouts are in flight, cleaned up and resumed, against the same run never killed.
    args = ("run", str(EXAMPLE_TASKS), "--limit", "3", "-n", "4", "-c", "3", "--epsilon", "0.4",
            "--seed", "11", "-q")  # fmt: skip
    full, killed = tmp_path / "full.jsonl", tmp_path / "killed.jsonl"
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, "-o", str(killed), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(120):
            while not (
                _complete_lines(killed) >= 1 and _mid_episode(killed)
                and await containers_of(proc.pid)
            ):  # fmt: skip
                assert proc.returncode is None, await proc.stderr.read()  # type: ignore[union-attr]
                await asyncio.sleep(0.02)
        proc.kill()  # no teardown runs: the next run's cleanup must find what it left
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    before = _keys(killed)
    assert 1 <= len(before) < 12
    assert await containers_of(proc.pid)  # live when killed
    cleaned = await asyncio.to_thread(cli, "cleanup")
    assert cleaned.code == 0, cleaned.err
    assert await containers_of(proc.pid) == []
    res = await asyncio.to_thread(cli, *args, "-o", str(killed), "--resume")
    assert res.code == 0, res.err
    assert f"wrote {12 - len(before)} trajectories" in res.out
    resumed = [r for r in load_results(killed) if r.trajectory.info.get("resumed_at_step")]
    assert resumed  # continued in a restored container from the step the kill cut
    res = await asyncio.to_thread(cli, *args, "-o", str(full))
    assert res.code == 0, res.err
    expected = _runs(full)
    assert len(expected) == 12 and len({a for a, _ in expected.values()}) > 3
    assert _runs(killed) == expected


def test_a_long_output_path_is_printed_in_one_piece(tmp_path: Path, cli: Invoke) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 4)
    deep.mkdir()
    out = deep / "results-with-a-long-name.jsonl"
    res = cli("run", "--env", "chain", "--limit", "1", "-o", str(out), "-q")
    assert res.code == 0, res.err
    assert f"wrote 1 trajectories to {out} (1 in the file)" in res.out
