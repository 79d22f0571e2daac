from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest

from llenvs_async._ownership import current_owner
from llenvs_async.cli import _sources
from llenvs_async.cli._options import ScheduleKind
from llenvs_async.cli._results import load_results
from llenvs_async.docker.snapshots import SNAPSHOT_OWNER_LABEL
from llenvs_async.envs import CounterEnv
from llenvs_async.runner._lockstep import SCHEDULES
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


def test_the_schedule_does_not_change_the_samples(cli: Invoke, tmp_path: Path) -> None:
    """``--schedule async`` (and chunks) on a pure env: the same actions as refill."""
    actions: dict[str, dict[tuple[object, int], list[str]]] = {}
    for schedule in ("refill", "async", "chunks"):
        out = tmp_path / f"{schedule}.jsonl"
        args = ["--env", "chain", "-n", "3", "-c", "4", "--epsilon", "0.5", "--seed", "7"]
        res = cli("run", *args, "--schedule", schedule, "-o", str(out), "-q")
        assert res.code == 0, res.err
        actions[schedule] = {
            key: [a.text for a in traj.actions]
            for key, traj in zip(_keys(out), read_trajectories(out), strict=True)
        }
    assert len(actions["refill"]) == 15
    assert len({tuple(a) for a in actions["refill"].values()}) > 1  # the seed matters
    assert actions["async"] == actions["refill"] == actions["chunks"]
    q = ["q-values", str(tmp_path / "refill.jsonl"), "-n", "2", "--max-states", "1"]
    res = cli(*q, "--schedule", "async", "--json", str(tmp_path / "q.json"))
    assert res.code == 0, res.err
    assert json.loads((tmp_path / "q.json").read_text())


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


@pytest.fixture
def submit_crashes(cli: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results file of the counter env; from then on every "submit" crashes its
    environment, so all Q(s, submit) rollouts fail."""
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "counter", "-t", "3", "-n", "1", "-o", str(out), "-q").code == 0
    monkeypatch.setattr(_sources, "CounterEnv", functools.partial(CounterEnv, fail_on="submit"))
    return out


def test_q_values_failures_option(cli: Invoke, tmp_path: Path, submit_crashes: Path) -> None:
    out = submit_crashes

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


def test_q_values_trajectories_writes_the_rollouts_behind_each_estimate(
    cli: Invoke, tmp_path: Path, submit_crashes: Path
) -> None:
    out = submit_crashes
    est, trajs = tmp_path / "q.json", tmp_path / "q.rollouts.jsonl"
    trajs.write_text("stale\n")  # overwritten, as --json is
    res = cli("q-values", str(out), "-a", "submit", "-n", "3", "--json", str(est),
              "--trajectories", str(trajs), "--plot", str(tmp_path / "q.png"))  # fmt: skip
    assert res.code == 0, res.err
    rows = json.loads(est.read_text())
    assert len({r["id"] for r in rows}) == len(rows) == 3  # V(s), Q(s, submit), Q(s, inc)
    assert all(r["trajectories"] == str(trajs) for r in rows)
    records = read_jsonl(trajs)
    by_estimate: dict[str, list[int]] = {}
    for number, record in enumerate(records):
        by_estimate.setdefault(record["estimate"], []).append(number)
    assert set(by_estimate) == {r["id"] for r in rows}
    assert [r["key"]["rollout"] for r in records] == list(range(len(records)))  # unique keys
    assert all(r["key"]["task"] == rows[0]["task"] for r in records)
    loaded = load_results(trajs)  # a results file: `view` (and `q-values`) read it as one
    for row in rows:
        mine = [loaded[i].trajectory for i in by_estimate[row["id"]]]
        assert len(mine) == row["n"] + row["failed"] == 3  # failures=exclude
        assert sum(t.error is not None for t in mine) == row["failed"]
        assert [t.total_reward for t in mine if t.error is None] == row["returns"]
        if row["kind"] == "Q":
            assert all(t.actions[0].text == row["action"] for t in mine if t.error is None)
    submit = next(r for r in rows if r["action"] == "submit")
    assert submit["failed"] == 3  # every Q(s, submit) rollout failed: kept, with its error
    assert all(loaded[i].trajectory.error for i in by_estimate[submit["id"]])
    # without the flag: the ids (so files from several runs never collide), no file named
    res = cli("q-values", str(out), "-a", "inc", "-n", "2", "--json", str(est),
              "--plot", str(tmp_path / "q.png"))  # fmt: skip
    assert res.code == 0, res.err
    again = json.loads(est.read_text())
    assert all(r["trajectories"] is None for r in again)
    assert not {r["id"] for r in again} & {r["id"] for r in rows}


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


def test_the_schedule_flag_offers_the_runners_schedules() -> None:
    assert tuple(ScheduleKind) == SCHEDULES
