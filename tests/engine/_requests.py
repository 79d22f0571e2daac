"""Requests and outcome checks the engine-tier tests share."""

from __future__ import annotations

from llenvs_async.types import ChatMessage, Completion, GenerationError, GenerationRequest


def chat(
    text: str, *, seed: int | None = None, index: int = 0, system: str = "You are terse."
) -> GenerationRequest:
    """A two-message conversation as one rollout's request."""
    return GenerationRequest(
        messages=(
            ChatMessage(role="system", content=system),
            ChatMessage(role="user", content=text),
        ),
        rollout_index=index,
        seed=seed,
    )


def completions(outcomes: list[Completion | GenerationError]) -> list[Completion]:
    """Every outcome, asserted to be a Completion (no per-request failure)."""
    assert all(isinstance(o, Completion) for o in outcomes), outcomes
    return [o for o in outcomes if isinstance(o, Completion)]
