"""``--runtime gvisor`` from the CLI: `run` records the runtime, `q-values --snapshot` forks
sandboxes with their processes; nothing is left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters import harbor
from llenvs_async.adapters.harbor import SnapshotRestore
from llenvs_async.cli import main
from llenvs_async.sandbox import Runsc
from llenvs_async.serialization import read_jsonl

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_run_and_q_values_on_gvisor(
    runsc: Runsc,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, est = tmp_path / "r.jsonl", tmp_path / "q.json"
    code = main(["run", str(TASKS), "-t", "organize-files", "-n", "1", "-o", str(out), "-q",
                 "--runtime", "gvisor"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (record,) = read_jsonl(out)
    assert record["source"]["harbor"]["runtime"] == "gvisor"
    made: list[SnapshotRestore] = []

    class Recorded(SnapshotRestore):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(harbor, "SnapshotRestore", Recorded)
    code = main(["q-values", str(out), "-a", "rm -rf /app/*", "-n", "2", "--snapshot",
                 "--json", str(est), "--plot", str(tmp_path / "q.png")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = json.loads(est.read_text())
    assert all(r["failed"] == 0 for r in rows)
    q = {r["action"]: r for r in rows if r["kind"] == "Q"}
    assert q["rm -rf /app/*"]["mean"] == 0.0 and q["rm -rf /app/*"]["n"] == 2
    (restore,) = made
    assert restore.processes and restore.stats.forks > 0 and restore.stats.fallbacks == 0


def test_bad_runtime_is_a_clear_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(TASKS), "--runtime", "kata", "-q"]) != 0
    assert "--runtime must be 'runc' or 'gvisor', got 'kata'" in capsys.readouterr().err
