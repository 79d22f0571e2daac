"""OpenAIBackend.update_weights: the HTTP sequence, resume on failure, abort resends (mock server;
the real dev-mode vLLM server is in tests/engine/test_openai_weights.py)."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from llenvs_async import GenerationRequest, SamplingParams
from llenvs_async.backends.openai import OpenAIBackend
from llenvs_async.errors import BackendError

torch = pytest.importorskip("torch", reason="run 'make vllm' (it brings torch)")

WEIGHTS = [("w", torch.ones(2))]


class Server:
    """Records the RL calls; the paths in ``fail`` answer 500, those in ``hang`` never answer."""

    def __init__(self, *fail: str, hang: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail
        self.hang = hang
        self.saw_file = False
        self.paused = asyncio.Event()
        self.completions: list[list[str]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/completions":
            prompts = json.loads(request.content)["prompt"]
            self.completions.append(prompts)
            if len(self.completions) == 1:  # the first batch is in flight when the update aborts
                await self.paused.wait()
            reasons = [
                "length" if "keep" in p or len(self.completions) > 1 else "abort" for p in prompts
            ]
            choices = [
                {"index": i, "text": p, "finish_reason": r}
                for i, (p, r) in enumerate(zip(prompts, reasons, strict=True))
            ]
            return httpx.Response(200, json={"choices": choices})
        self.calls.append((path, request.url.query.decode() or request.content.decode()))
        if path == "/collective_rpc":
            directory = json.loads(request.content)["kwargs"]["weights_path"]
            self.saw_file = os.path.isfile(os.path.join(directory, "model.safetensors"))
        if path == "/pause":
            self.paused.set()
        if path in self.hang:
            await asyncio.Event().wait()
        if path in self.fail:
            return httpx.Response(500, text=f"boom at {path}")
        return httpx.Response(200, json={})


def backend(server: Server, **kwargs: float) -> OpenAIBackend:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return OpenAIBackend("http://127.0.0.1:9/v1", "m", client=client, mode="completions", **kwargs)


async def test_the_update_pauses_reloads_resets_labels_and_resumes() -> None:
    server = Server()
    llm = backend(server)
    await llm.update_weights(WEIGHTS, version=5, mode="wait")
    assert [path for path, _ in server.calls] == [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]
    assert server.calls[0][1] == "mode=wait&clear_cache=false"
    assert server.calls[2][1] == "reset_running_requests=true"
    assert json.loads(server.calls[3][1]) == {"new_version": "5"}
    assert server.saw_file and llm.policy_version == 5


async def test_a_failed_reload_still_resumes_and_keeps_the_old_version() -> None:
    server = Server("/collective_rpc")
    llm = backend(server)
    with pytest.raises(BackendError, match="HTTP 500"):
        await llm.update_weights(WEIGHTS, version=1)
    assert [path for path, _ in server.calls][-1] == "/resume"
    assert llm.policy_version == 0


async def test_a_failed_resume_is_a_note_on_the_load_error_which_stays_the_one_raised() -> None:
    server = Server("/collective_rpc", "/resume")
    llm = backend(server)
    with pytest.raises(BackendError, match="boom at /collective_rpc") as caught:
        await llm.update_weights(WEIGHTS, version=1)
    notes = getattr(caught.value.__cause__ or caught.value, "__notes__", [])
    assert any("resuming the engine afterwards failed" in n and "/resume" in n for n in notes)
    assert llm.policy_version == 0


async def test_a_failed_resume_after_a_good_load_raises_and_keeps_the_old_version() -> None:
    llm = backend(Server("/resume"))
    with pytest.raises(BackendError, match="loaded, but the engine could not be resumed"):
        await llm.update_weights(WEIGHTS, version=1)
    assert llm.policy_version == 0


async def test_a_hung_server_times_out_resumes_and_says_so() -> None:
    server = Server(hang=("/collective_rpc",))
    llm = backend(server, update_timeout=0.2)
    with pytest.raises(
        BackendError, match=r"timed out after 0.2 s in reload_weights; the engine was resumed"
    ):
        await llm.update_weights(WEIGHTS, version=1)
    assert [path for path, _ in server.calls][-1] == "/resume"
    assert llm.policy_version == 0


async def test_a_hung_resume_too_says_the_engine_may_still_be_paused() -> None:
    server = Server(hang=("/pause", "/resume"))
    llm = backend(server, update_timeout=0.2)
    with pytest.raises(
        BackendError, match=r"in pause; the engine could not be resumed .*still be paused"
    ):
        await llm.update_weights(WEIGHTS, version=1, mode="wait")
    assert [path for path, _ in server.calls] == ["/pause", "/resume"]


async def test_a_cancelled_caller_of_a_hung_update_gets_its_cancellation() -> None:
    llm = backend(Server(hang=("/collective_rpc",)), update_timeout=0.2)
    call = asyncio.create_task(llm.update_weights(WEIGHTS, version=1))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call  # before update_timeout, this waited forever
    assert llm.policy_version == 0


def test_update_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="OpenAIBackend update_timeout must be > 0, got 0"):
        OpenAIBackend("http://127.0.0.1:9/v1", "m", update_timeout=0)


async def test_abort_resends_only_the_aborted_prompts_of_a_batch() -> None:
    server = Server()
    llm = backend(server)
    batch = [
        GenerationRequest(messages=(), prompt_token_ids=None, rollout_index=i) for i in range(3)
    ]
    renders = iter(["keep 0", "abort 1", "abort 2"])
    llm._prompt_renderer = lambda messages: next(renders)  # type: ignore[method-assign]
    call = asyncio.create_task(llm.generate(batch, SamplingParams(max_tokens=4)))
    await llm.update_weights(WEIGHTS, version=2, mode="abort")
    outs = await call
    assert [o.finish_reason for o in outs] == ["length"] * 3  # type: ignore[union-attr]
    assert [o.text for o in outs] == ["keep 0", "abort 1", "abort 2"]  # type: ignore[union-attr]
    assert server.completions == [["keep 0", "abort 1", "abort 2"], ["abort 1", "abort 2"]]
    assert [o.policy_version for o in outs[1:]] == [2, 2]  # type: ignore[union-attr]
