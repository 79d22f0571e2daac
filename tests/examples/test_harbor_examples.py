"""The Docker-backed examples: the seed's multi-instance recipe and the Q-value demo."""

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
    out = run_example("demo.py", "--out", str(tmp_path), "--rollouts", "6", timeout=600).stdout
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
