"""`run --token-mode` flag combinations are checked before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = (sys.executable, "-m", "llenvs_async.cli")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--token-mode"], "--token-mode needs --backend vllm or openai"),
        (
            [
                "--token-mode",
                "--backend",
                "openai",
                "--model",
                "m",
                "--base-url",
                "http://127.0.0.1:9/v1",
            ],
            "needs --tokenizer",
        ),
        (
            ["--backend", "vllm", "--model", "m", "--tokenizer", "/nonexistent"],
            "is not a directory",
        ),
    ],
)
def test_token_mode_flags_are_checked(flags: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    proc = subprocess.run(
        [*CLI, "run", "--env", "arithmetic", *flags, "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists()
