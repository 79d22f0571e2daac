from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest

from llenvs_async.cli import _sources
from llenvs_async.docker.ownership import current_owner
from llenvs_async.docker.snapshots import SNAPSHOT_OWNER_LABEL
from llenvs_async.envs import CounterEnv
from llenvs_async.serialization import read_jsonl, read_trajectories

from .conftest import EXAMPLE_TASKS, Invoke


def _keys(path: Path) -> list[tuple[object, int]]:
    return [(r["key"]["task"], r["key"]["rollout"]) for r in read_jsonl(path)]


def test_run_streams_one_record_per_task_and_rollout(cli: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = cli("run", "--env", "chain", "-n", "2", "-c", "3", "-o", str(out), "-q")
    assert res.code == 0, res.err
    assert sorted(_keys(out)) == [(t, r) for t in range(5) for r in range(2)]
    trajs = read_trajectories(out)
    assert all(t.success and t.error is None for t in trajs)
    # the corridor of task i has length 3 + i: the oracle walks it in exactly that many steps
    for record, traj in zip(read_jsonl(out), trajs, strict=True):
        assert len(traj) == 3 + record["key"]["task"]
        assert record["source"] == {"env": "chain", "dataset": None, "max_steps": None}
    assert "total" in res.out and "10" in res.out


def test_epsilon_makes_the_scripted_oracle_fail_sometimes(cli: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    res = cli("run", "--env", "counter", "-n", "6", "--epsilon", "0.5", "-o", str(out), "-q")
    assert res.code == 0, res.err
    trajs = read_trajectories(out)
    assert len(trajs) == 30
    successes = sum(t.success for t in trajs)
    assert 0 < successes < 30
    assert any(a.text == "dec" for t in trajs for a in t.actions)


def test_q_values_on_a_run_output(cli: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "counter", "-t", "3", "-n", "2", "-o", str(out), "-q").code == 0
    est, png = tmp_path / "q.json", tmp_path / "q.png"
    res = cli(
        "q-values", str(out), "-a", "submit", "-n", "4", "--json", str(est), "--plot", str(png)
    )
    assert res.code == 0, res.err
    rows = json.loads(est.read_text())
    # counter to 3: the oracle ran inc, inc, inc, submit; the mid state (step 2) has value 2
    assert {(r["kind"], r["action"]) for r in rows} == {("V", None), ("Q", "submit"), ("Q", "inc")}
    by_action = {r["action"]: r for r in rows}
    assert rows[0]["step"] == 2 and rows[0]["prefix"] == ["inc", "inc"]
    assert by_action[None]["mean"] == 1.0 and by_action[None]["n"] == 4
    assert by_action["inc"]["mean"] == 1.0
    # 0 of 4: Wilson's interval inside CounterEnv's (0, 1), not a zero-width [0, 0]
    submit = by_action["submit"]
    assert submit["mean"] == 0.0 and submit["ci_low"] == 0.0 and 0.3 < submit["ci_high"] < 1.0
    assert submit["method"] == "wilson" and submit["reward_range"] == [0.0, 1.0]
    assert "Q: submit" in res.out and "wilson" in res.out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_q_values_failures_option(
    cli: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "counter", "-t", "3", "-n", "1", "-o", str(out), "-q").code == 0
    # from here on, every "submit" crashes its environment: Q(s, submit) rollouts all fail
    monkeypatch.setattr(_sources, "CounterEnv", functools.partial(CounterEnv, fail_on="submit"))

    def rows(*flags: str) -> dict[object, dict[str, object]]:
        est = tmp_path / "q.json"
        res = cli("q-values", str(out), "-a", "submit", "-n", "3", "--json", str(est), *flags)
        assert res.code == 0, res.err
        assert "failed" in res.out and "method" in res.out
        return {r["action"]: r for r in json.loads(est.read_text())}

    excluded = rows()["submit"]
    assert excluded["failed"] == 3 and excluded["n"] == 0 and excluded["mean"] is None
    assert [excluded["ci_low"], excluded["ci_high"]] == [0.0, 1.0]  # no data: the whole range
    zeroed = rows("--failures", "zero")["submit"]
    assert zeroed["failed"] == 3 and zeroed["n"] == 3 and zeroed["returns"] == [0.0] * 3
    res = cli("q-values", str(out), "-a", "submit", "-n", "3", "--failures", "raise")
    assert res.code != 0 and "rollouts failed (failures='raise')" in res.err
    assert "EnvError: CounterEnv was told to fail on 'submit'" in res.err
    res = cli("q-values", str(out), "--failures", "drop")
    assert res.code != 0 and "--failures" in res.err


def test_tasks_list_builtin(cli: Invoke) -> None:
    res = cli("tasks", "list", "--env", "chain")
    assert res.code == 0
    assert "corridor of length 7" in res.out


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("restore", [[], ["--snapshot"]], ids=["replay", "snapshot"])
def test_run_then_q_values_on_harbor_tasks(
    cli: Invoke, tmp_path: Path, docker_ready: None, restore: list[str]
) -> None:
    out = tmp_path / "h.jsonl"
    res = cli("run", str(EXAMPLE_TASKS), "-t", "csv-totals", "-t", "organize-files", "-n", "2",
              "-c", "4", "--epsilon", "0.2", "-o", str(out), "-q")  # fmt: skip
    assert res.code == 0, res.err
    assert sorted(_keys(out)) == [
        (f"llenvs-examples/{t}", r) for t in ("csv-totals", "organize-files") for r in (0, 1)
    ]
    trajs = read_trajectories(out)
    assert all(t.error is None for t in trajs)
    assert all(t.final_state.hidden["task_name"] == t.initial_state.task for t in trajs)
    est = tmp_path / "q.json"
    res = cli("q-values", str(out), "-t", "organize-files", "-a", "rm -rf /app/*", "-n", "3",
              "--json", str(est), "--plot", str(tmp_path / "q.png"), *restore)  # fmt: skip
    assert res.code == 0, res.err
    q = {r["action"]: r for r in json.loads(est.read_text()) if r["kind"] == "Q"}
    assert q["rm -rf /app/*"]["mean"] == 0.0 and q["rm -rf /app/*"]["n"] == 3
    assert len(q) >= 2
    assert all(r["failed"] == 0 for r in json.loads(est.read_text()))
    mine = f"label={SNAPSHOT_OWNER_LABEL}={current_owner().label}"
    snapshots = subprocess.run(
        ["docker", "images", "-q", "--filter", mine], capture_output=True, text=True, check=True
    ).stdout
    assert snapshots == ""  # the runner removed its snapshot images on close
