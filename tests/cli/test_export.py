"""``llenvs-async export``: token records round trip through Parquet and a HF dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pytest

from llenvs_async import Completion, GenerationRequest, ScriptedBackend, Trajectory
from llenvs_async import TrajectoryRunner as Runner
from llenvs_async.envs import ChainEnv
from llenvs_async.serialization import JsonlWriter
from llenvs_async.testing.chat_tokenizer import IM_END, ChatMLTokenizer

from .conftest import Invoke


async def token_trajectories() -> list[Trajectory]:
    tok = ChatMLTokenizer()

    def policy(request: GenerationRequest) -> Completion:
        if request.rollout_index == 2 and request.step == 1:
            return Completion(text="boom", token_ids=())  # fails this rollout at step 1
        text = "right" if request.rollout_index % 2 == 0 else "left"
        ids = (*tok.char_ids(text), IM_END)
        return Completion(
            text=text,
            token_ids=ids,
            logprobs=tuple(-0.1 * (k + 1) for k in range(len(ids))),
            reasoning=f"step {request.step}" if request.rollout_index == 0 else None,
        )

    backend = ScriptedBackend(policy, tokenizer=tok, policy_version=3)
    runner = Runner(ChainEnv(max_steps=3), backend, token_mode=True)
    return await runner.run_batch([0, 1, 2])


def expected_row(traj: Trajectory) -> dict[str, Any]:
    record = traj.token_record()
    assert record is not None
    return {
        "input_ids": list(record.input_ids),
        "loss_mask": list(record.loss_mask),
        "logprobs": None if record.logprobs is None else list(record.logprobs),
        "policy_versions": [3] if traj.transitions else [],
        "token_versions": [3] * sum(record.loss_mask),
        "turns": [list(t) for t in record.turns],
        "prompt_length": record.prompt_length,
        "rewards": [t.reward for t in traj.transitions],
        "reasoning": [t.completion and t.completion.reasoning for t in traj.transitions],
        "parse_error": [None] * len(traj.transitions),
        "stop_reason": traj.stop_reason,
        "task": str(traj.initial_state.task),
    }


def written(tmp_path: Path, trajs: list[Trajectory]) -> Path:
    path = tmp_path / "results.jsonl"
    with JsonlWriter(path) as writer:
        for traj in trajs:
            writer.write_trajectory(traj)
    return path


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
async def test_export_round_trip_equals_the_token_records(
    cli: Invoke, tmp_path: Path, fmt: str
) -> None:
    trajs = await token_trajectories()
    assert trajs[2].error is not None  # a failed rollout is exported too
    out = tmp_path / "out"
    res = cli("export", str(written(tmp_path, trajs)), "--format", fmt, "-o", str(out))
    assert res.code == 0, res.err
    assert "exported 3 trajectories" in res.out
    if fmt == "parquet":
        rows = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    else:
        rows = datasets.load_from_disk(str(out))
    assert len(rows) == len(trajs)
    for traj, got in zip(trajs, rows, strict=True):
        want = expected_row(traj)
        assert {k: got[k] for k in want} == want
        assert got["episode_id"] == traj.episode_id
        assert got["total_reward"] == traj.total_reward
    assert rows[0]["reasoning"] == ["step 0", "step 1", "step 2"][: len(trajs[0])]
    assert rows[2]["error"].startswith("BackendError: token mode")
    assert rows[0]["error"] is None
    assert sum(rows[0]["loss_mask"]) == len(rows[0]["logprobs"])


async def test_export_refuses_trajectories_without_token_ids(cli: Invoke, tmp_path: Path) -> None:
    plain = await Runner(ChainEnv(), ScriptedBackend(lambda r: "right")).run_batch([0])
    path = written(tmp_path, [*plain, *(await token_trajectories())])
    res = cli("export", str(path), "-o", str(tmp_path / "out"))
    assert res.code == 1
    assert "record 1" in res.err and "token_mode=True" in res.err
    res = cli("export", str(path), "-o", str(tmp_path / "out"), "--skip-missing")
    assert res.code == 0 and "1 without token ids skipped" in res.out


def test_export_of_a_missing_file_is_one_line(cli: Invoke, tmp_path: Path) -> None:
    res = cli("export", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "out"))
    assert res.code == 2 and "does not exist" in res.err and res.err.count("\n") == 1
