"""The tiny-model builder: deterministic bytes, a ChatML tokenizer, the stated architecture."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from llenvs_async.testing.tiny_model import MODEL_CONFIG, VOCAB_SIZE, build_tiny_model


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_two_builds_are_byte_identical_and_the_cli_builds_the_same(
    tiny_model: Path, tmp_path: Path
) -> None:
    built = build_tiny_model(tmp_path / "a")
    proc = subprocess.run(
        [sys.executable, "-m", "llenvs_async.testing.tiny_model", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(str(tmp_path / "b"))
    first = digests(built)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= first.keys()
    assert digests(tmp_path / "b") == first
    cached = {k: v for k, v in digests(tiny_model).items() if not k.startswith(".")}
    assert cached == first


def test_tokenizer_and_config_are_what_the_tier_relies_on(
    tiny_model: Path, hf_tokenizer: object
) -> None:
    from transformers import PreTrainedTokenizerBase

    assert isinstance(hf_tokenizer, PreTrainedTokenizerBase)
    text = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.pad_token == "<|endoftext|>"
    assert len(hf_tokenizer) <= VOCAB_SIZE
    ids = hf_tokenizer.encode("def f(x):\n    return x", add_special_tokens=False)
    assert hf_tokenizer.decode(ids) == "def f(x):\n    return x"  # byte-level: lossless
    config = json.loads((tiny_model / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        assert config[key] == MODEL_CONFIG[key]
    assert config["eos_token_id"] == hf_tokenizer.eos_token_id
    assert config["vocab_size"] == len(hf_tokenizer)
