"""Per-token logprobs of completions whose prompts share a long prefix, at a fraction of the cost.

Every relay prompt starts with the same system block (the tool schema and the hermes
instructions, ~250 of ~350 tokens). ``shared_prefix_logprobs`` runs that prefix once, repeats
its key/value cache over the batch and runs only the rest: the same numbers as
``llenvs_async.testing.torch_logprobs.completion_logprobs`` (causal attention: the prefix never
sees what follows it), gradients included, ~3x faster on CPU for these prompts. Only the
completion positions go through the output head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every prompt shares, leaving each at least one token."""
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return max(n, 0)


def shared_prefix_logprobs(
    model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
) -> list[Any]:
    """A 1-D tensor per ``(prompt_ids, completion_ids)`` pair: each completion token's logprob
    under ``model`` (a Llama-style HF causal LM: decoder, then an unscaled output head) with
    its logits divided by ``temperature`` (the distribution an engine samples at that
    temperature), with the autograd graph kept."""
    import torch

    from llenvs_async.testing.torch_logprobs import completion_logprobs

    if not pairs:
        return []
    cut = common_prefix([p for p, _ in pairs])
    if cut < 2:
        return completion_logprobs(model, pairs, temperature)
    device = next(model.parameters()).device
    prefix = torch.tensor([list(pairs[0][0][:cut])], device=device)
    decoder = model.get_decoder()
    cache = decoder(input_ids=prefix, use_cache=True).past_key_values
    cache.batch_repeat_interleave(len(pairs))
    rests = [list(p[cut:]) + list(c) for p, c in pairs]
    width = max(len(r) for r in rests)
    ids = torch.zeros((len(rests), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rests), cut + width), dtype=torch.long, device=device)
    mask[:, :cut] = 1
    for row, rest in enumerate(rests):
        ids[row, : len(rest)] = torch.tensor(rest, device=device)
        mask[row, cut : cut + len(rest)] = 1
    hidden = decoder(input_ids=ids, attention_mask=mask, past_key_values=cache).last_hidden_state
    head = model.get_output_embeddings()
    out: list[Any] = []
    for row, (prompt, completion) in enumerate(pairs):
        start = len(prompt) - cut - 1  # the hidden state at position t predicts token t + 1
        # only the completion's positions go through the head: a real vocabulary (49k for
        # SmolLM2) makes logits over every position the bulk of the memory
        logits = head(hidden[row, start : start + len(completion)]).float() / temperature
        rows = logits.log_softmax(-1)
        targets = torch.tensor(list(completion), device=device)
        out.append(rows.gather(-1, targets[:, None]).squeeze(-1))
    return out
