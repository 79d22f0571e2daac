"""The Docker-backed examples: the seed's multi-instance recipe and the Q-value demo (the
real model by default, the scripted oracle with ``--policy oracle``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llenvs_async import State
from llenvs_async.serialization import from_dict, read_jsonl

from .conftest import run_example

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(300 + 120)
def test_q_values_harbor_recipe(docker_ready: None) -> None:
    out = run_example("q_values_harbor.py", timeout=300).stdout
    q = {m[1]: float(m[2]) for m in re.finditer(r"Q\(s, '(.+?)'\) = ([\d.]+) \(n=6\)", out)}
    assert q == {"python3 -m json.tool /app/config.json": 1.0, "rm -f /app/config.json": 0.0}
    assert "replay of json-config: consistent=True" in out
    assert "replay of random-session: consistent=False" in out
    peak = int(re.search(r"peak live containers: (\d+)", out)[1])  # type: ignore[index]
    assert 1 < peak <= 4  # batch_size=4 caps live containers


@pytest.mark.timeout(600 + 120)
def test_demo_separates_correct_from_destructive(docker_ready: None, tmp_path: Path) -> None:
    out = run_example(
        "demo.py", "--policy", "oracle", "--out", str(tmp_path), "--rollouts", "6", timeout=600
    ).stdout
    assert "containers left: 0" in out
    separated = re.search(r"non-overlapping 95% intervals on: (.+)", out)[1]  # type: ignore[index]
    assert separated != "none"
    rows = re.findall(
        r"^(\S+)\s+(\d+)\s+(.+?)\s+(-?[\d.]+)\s+\[(-?[\d.]+), (-?[\d.]+)\]\s+(\S+)\s+6\s+(\d+)$",
        out,
        re.M,
    )
    assert len(rows) == 6
    assert {r[6] for r in rows} == {"wilson"} and {r[7] for r in rows} == {"0"}  # method, failed
    assert all(0.0 <= float(r[4]) <= float(r[5]) <= 1.0 for r in rows)  # inside the range
    destructive = [r for r in rows if r[2] == "rm -rf /app/*"]
    assert [float(r[3]) for r in destructive] == [0.0, 0.0, 0.0]
    states = [from_dict(State, d) for d in read_jsonl(tmp_path / "states.jsonl")]
    assert [s.step for s in states] == [int(r[1]) for r in rows[::2]]
    assert all(s.actions and not s.done for s in states)
    assert (tmp_path / "q_values.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.vllm
@pytest.mark.timeout(600 + 120)
def test_demo_runs_the_real_model_and_estimates_q_at_its_own_states(
    docker_ready: None, tmp_path: Path
) -> None:
    """The default demo: the real model on the easy held-out tasks, its success and every
    reply's fate, then Q(s, its own first action) against Q(s, the solution's command) at
    start states of its own trajectories (one it failed, one it solved, when both exist)."""
    out = run_example("demo.py", "--out", str(tmp_path), "--rollouts", "4", timeout=600).stdout
    assert "containers left: 0" in out
    collected = re.search(r"collected 24 trajectories: (\d+) successful \(\d+%\), 0 failed", out)
    assert collected is not None, out
    replies = int(re.search(r"^(\d+) replies:$", out, re.M)[1])  # type: ignore[index]
    fates = [int(n) for n in re.findall(r"^\s+(\d+)  (?:parsed|format error: .+)$", out, re.M)]
    assert replies >= 24 and sum(fates) == replies
    row = r"^(\S+)\s+0\s+(model|solution): (.+?)\s+([\d.]+)\s+\[([\d.]+), ([\d.]+)\]"
    rows = re.findall(row + r"\s+wilson\s+4\s+0$", out, re.M)
    assert rows and len(rows) % 2 == 0 and [r[1] for r in rows[:2]] == ["model", "solution"]
    assert all(0.0 <= float(r[4]) <= float(r[3]) <= float(r[5]) <= 1.0 for r in rows)
    states = [from_dict(State, d) for d in read_jsonl(tmp_path / "states.jsonl")]
    assert len(states) == len(rows) // 2 and all(s.step == 0 and not s.done for s in states)
    assert len({r[0] for r in rows}) == len(states)  # one state per task
    assert (tmp_path / "q_values.png").read_bytes().startswith(b"\x89PNG")
