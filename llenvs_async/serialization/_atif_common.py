"""What reading an ATIF document needs, whoever wrote it: its checks and its fields as ours."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import LlenvsError
from ..types import Completion, Observation
from . import from_dict

__all__ = [
    "KEY",
    "AtifError",
    "calls_of",
    "check_step",
    "generation",
    "ints",
    "is_atif",
    "openai_calls",
    "ours_of",
    "results_of",
    "text_of",
    "unplain",
]

KEY = "llenvs_async"


class AtifError(LlenvsError, ValueError):
    """An ATIF document that cannot be read, or a step whose effect cannot be replayed."""


def is_atif(data: Any) -> bool:
    """Whether ``data`` is an ATIF trajectory document (its version and its steps)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("schema_version"), str)
        and data["schema_version"].startswith("ATIF-v")
        and isinstance(data.get("steps"), list)
    )


def openai_calls(calls: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """ATIF tool calls as OpenAI's (``arguments`` as a JSON string), as our actions hold them."""
    return tuple(
        {
            "id": call.get("tool_call_id"),
            "type": "function",
            "function": {
                "name": call.get("function_name"),
                "arguments": json.dumps(call.get("arguments") or {}),
            },
        }
        for call in calls
    )


def check_step(raw: Any, index: int) -> Mapping[str, Any]:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise AtifError(f"{where}: expected an object, got {type(raw).__name__}", field=where)
    source = raw.get("source")
    if source not in ("system", "user", "agent"):
        raise AtifError(
            f"{where}.source: expected 'system', 'user' or 'agent', got {source!r:.60}",
            field=f"{where}.source",
            value=source,
        )
    return raw


def text_of(content: Any) -> str:
    """A message or result content: a string, or the text parts of a multimodal list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text")) for p in content if isinstance(p, Mapping) and p.get("text")
        )
    return ""


def results_of(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    observation = step.get("observation")
    results = observation.get("results") if isinstance(observation, Mapping) else None
    return [r for r in results if isinstance(r, Mapping)] if isinstance(results, list) else []


def calls_of(step: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    calls = step.get("tool_calls")
    return [c for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else []


def ours_of(step: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = step.get("extra")
    ours = extra.get(KEY) if isinstance(extra, Mapping) else None
    return ours if isinstance(ours, Mapping) else {}


def unplain(value: Any) -> Any:
    """Inverse of the writer's ``_plain`` (tagged tuples come back as tuples)."""
    return from_dict(Observation, {"text": "", "data": {"v": value}}).data["v"]


def ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


def generation(step: Mapping[str, Any], message: str, calls: tuple[Any, ...]) -> Completion:
    """The model's generation of an agent step (its metrics' token ids and logprobs)."""
    metrics = step.get("metrics") if isinstance(step.get("metrics"), Mapping) else {}
    assert isinstance(metrics, Mapping)
    logprobs = metrics.get("logprobs")
    reasoning = step.get("reasoning_content")
    return Completion(
        text=message,
        token_ids=ints(metrics.get("completion_token_ids")),
        logprobs=tuple(float(x) for x in logprobs) if isinstance(logprobs, list) else None,
        prompt_token_ids=ints(metrics.get("prompt_token_ids")),
        tool_calls=calls,
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )
