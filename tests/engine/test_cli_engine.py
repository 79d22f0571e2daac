"""``llenvs-async run`` as a user runs it, with a real engine: in-process vLLM and over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from llenvs_async.serialization import read_jsonl

from .conftest import ENGINE_ENV, Server

CLI = (sys.executable, "-m", "llenvs_async.cli")


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **ENGINE_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def check_results(out: Path, expected: int) -> list[dict[str, Any]]:
    records = list(read_jsonl(out))
    assert len(records) == expected
    for record in records:
        trajectory = record["trajectory"]
        assert trajectory.get("error") is None, trajectory["error"]
        assert trajectory["transitions"]
        for transition in trajectory["transitions"]:
            completion = transition["completion"]
            assert completion["token_ids"] and completion["prompt_token_ids"]
            assert len(completion["logprobs"]) == len(completion["token_ids"])
    return records


def test_cli_run_with_the_in_process_vllm_backend(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "vllm.jsonl"
    proc = run_cli(
        "run", "--env", "arithmetic", "--limit", "2", "-n", "3",
        "--backend", "vllm", "--model", str(tiny_model),
        "--max-tokens", "12", "-o", str(out), "-q",
    )  # fmt: skip
    assert f"wrote 6 trajectories to {out}" in " ".join(proc.stdout.split())
    records = check_results(out, 6)
    # Three rollouts of one task sample independently (the CLI's default seed is per request).
    by_task: dict[int, set[str]] = {}
    for record in records:
        first = record["trajectory"]["transitions"][0]["action"]["text"]
        by_task.setdefault(record["key"]["task"], set()).add(first)
    assert all(len(texts) > 1 for texts in by_task.values()), by_task


def test_cli_run_with_the_openai_backend_against_the_real_server(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "openai.jsonl"
    run_cli(
        "run", "--env", "arithmetic", "--limit", "2", "-n", "2",
        "--backend", "openai", "--base-url", server.base_url, "--model", server.model,
        "--max-tokens", "12", "-o", str(out), "-q",
    )  # fmt: skip
    check_results(out, 4)


def test_cli_token_mode_run_then_export_for_a_trainer(
    server: Server, tiny_model: Path, tmp_path: Path
) -> None:
    """`run --token-mode` against the real server, then `export --format parquet`: the
    rows a trainer loads carry exact token records (mask on sampled ids only)."""
    datasets = __import__("datasets")
    out = tmp_path / "tokens.jsonl"
    run_cli(
        "run", "--env", "arithmetic", "--limit", "2", "-n", "2",
        "--backend", "openai", "--base-url", server.base_url, "--model", server.model,
        "--token-mode", "--tokenizer", str(tiny_model), "--max-tokens", "12",
        "-o", str(out), "-q",
    )  # fmt: skip
    records = check_results(out, 4)
    run_cli("export", str(out), "--format", "parquet", "-o", str(tmp_path / "pq"))
    rows = datasets.load_dataset("parquet", data_dir=str(tmp_path / "pq"), split="train")
    assert len(rows) == 4
    for row, record in zip(rows, records, strict=True):
        sampled = [t["completion"]["token_ids"] for t in record["trajectory"]["transitions"]]
        masked = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert masked == [tok for ids in sampled for tok in ids]
        assert len(row["logprobs"]) == sum(row["loss_mask"])
