"""A small ChatML tokenizer with a Hugging Face-style interface (token-mode tests, benchmarks).

Special tokens ``<|endoftext|>`` (0), ``<|im_start|>`` (1), ``<|im_end|>`` (2, the end of
turn a model samples); ``MERGES`` are multi-character tokens matched greedily, the rest is
one id per character (``1000 + ord``). Like a BPE tokenizer, text sampled one piece at a
time re-encodes differently (``r i g h t`` -> ``right``): the drift token mode avoids.
``enable_thinking=False`` (a template kwarg) appends an empty think block to the
generation prompt, as Qwen3's template does; ``tools`` are rendered in a system preamble
and an assistant's ``tool_calls`` as ``<tool_call>`` blocks after its content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["IM_END", "IM_START", "MERGES", "ChatMLTokenizer"]

ENDOFTEXT, IM_START, IM_END = 0, 1, 2
SPECIAL = {"<|endoftext|>": ENDOFTEXT, "<|im_start|>": IM_START, "<|im_end|>": IM_END}
MERGES = ("right", "left", "You are at ", "user", "assistant", "\n\n")
_CHAR_BASE = 1000
_MERGE_BASE = 500


class ChatMLTokenizer:
    """``apply_chat_template``, ``encode`` and ``decode``; counts template renders."""

    eos_token_id = IM_END

    def __init__(self) -> None:
        self.renders = 0
        self._merges = sorted(MERGES, key=len, reverse=True)

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        self.renders += 1
        text = "".join(
            f"<|im_start|>{m['role']}\n{m['content']}{_calls(m)}<|im_end|>\n" for m in conversation
        )
        if tools:  # a tools preamble first, as Qwen's template renders it
            text = f"<|im_start|>system\n# Tools\n{json.dumps(list(tools))}<|im_end|>\n" + text
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
            if not enable_thinking:
                text += "<think>\n\n</think>\n\n"
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for special, sid in SPECIAL.items():
                if text.startswith(special, i):
                    ids.append(sid)
                    i += len(special)
                    break
            else:
                for n, merge in enumerate(self._merges):
                    if text.startswith(merge, i):
                        ids.append(_MERGE_BASE + n)
                        i += len(merge)
                        break
                else:
                    ids.append(_CHAR_BASE + ord(text[i]))
                    i += 1
        return ids

    def piece(self, token_id: int) -> str:
        for special, sid in SPECIAL.items():
            if sid == token_id:
                return special
        if token_id >= _CHAR_BASE:
            return chr(token_id - _CHAR_BASE)
        return self._merges[token_id - _MERGE_BASE]

    def char_ids(self, text: str) -> list[int]:
        """``text`` one id per character: what a model sampling piece by piece may emit."""
        return [_CHAR_BASE + ord(c) for c in text]

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return "".join(
            self.piece(t) for t in token_ids if not (skip_special_tokens and t in SPECIAL.values())
        )


def _calls(message: Mapping[str, Any]) -> str:
    """An assistant turn's tool calls, hermes-style as Qwen's template writes them."""
    out = ""
    for call in message.get("tool_calls") or ():
        function = call["function"]
        arguments = function["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        body = json.dumps({"name": function["name"], "arguments": arguments})
        out += f"\n<tool_call>\n{body}\n</tool_call>"
    return out
