"""What a trainer computes for the ids an engine sampled: per-token logprobs under a HF model.

``completion_logprobs(model, pairs)`` runs ONE forward pass over a right-padded batch of
``prompt_ids + completion_ids`` and returns, for each pair, the log-softmax of the model's
raw logits at each completion token (vLLM's default ``logprobs_mode`` reports the same:
raw logits, before temperature or top-p/top-k). It keeps the autograd graph, so a policy
loss can use it directly; wrap it in ``torch.no_grad()`` to evaluate. Needs torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["completion_logprobs", "max_logprob_gap"]


def completion_logprobs(
    model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
) -> list[Any]:
    """A 1-D tensor per ``(prompt_ids, completion_ids)`` pair: token i's logprob given the
    prompt and completion tokens before it, with the logits divided by ``temperature`` (the
    distribution an engine samples at it). ``model`` is a causal LM (``model(input_ids,
    attention_mask=...).logits``), e.g. ``transformers.LlamaForCausalLM``."""
    import torch

    if not pairs:
        return []
    for i, (prompt, completion) in enumerate(pairs):
        if not prompt or not completion:
            raise ValueError(
                f"completion_logprobs pair {i}: prompt and completion must be non-empty, got "
                f"{len(prompt)} prompt and {len(completion)} completion ids"
            )
    device = next(model.parameters()).device
    sequences = [list(p) + list(c) for p, c in pairs]
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, device=device)
        mask[row, : len(seq)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits.float() / temperature
    out: list[Any] = []
    for row, (prompt, completion) in enumerate(pairs):
        start = len(prompt) - 1  # the logits at position t predict token t + 1
        rows = logits[row, start : start + len(completion)].log_softmax(-1)
        targets = torch.tensor(list(completion), device=device)
        out.append(rows.gather(-1, targets[:, None]).squeeze(-1))
    return out


def max_logprob_gap(
    model: Any,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    engine_logprobs: Sequence[Sequence[float]],
) -> float:
    """The largest |engine logprob - torch logprob| over every completion token of ``pairs``."""
    import torch

    if len(engine_logprobs) != len(pairs):
        raise ValueError(f"{len(engine_logprobs)} logprob lists for {len(pairs)} pairs")
    with torch.no_grad():
        ours = completion_logprobs(model, pairs)
    gap = 0.0
    for i, (mine, theirs) in enumerate(zip(ours, engine_logprobs, strict=True)):
        if len(theirs) != mine.numel():
            raise ValueError(f"pair {i}: {len(theirs)} engine logprobs for {mine.numel()} tokens")
        diff = (mine - torch.tensor(list(theirs), dtype=mine.dtype, device=mine.device)).abs()
        gap = max(gap, float(diff.max()))
    return gap
