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
