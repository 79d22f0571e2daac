"""Policy versions: backends tag completions with the version they finished under."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import pytest

from llenvs_async import Completion, GenerationRequest, SamplingParams, ScriptedBackend
from llenvs_async.backends import TrainableBackend
from llenvs_async.backends._vllm_compat import to_completion
from llenvs_async.backends._weights import engine_spans, weights_file

PARAMS = SamplingParams(max_tokens=4)


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest(messages=(), rollout_index=i) for i in range(n)]


async def test_scripted_backend_tags_completions_with_its_version() -> None:
    backend = ScriptedBackend(lambda r: "a")  # version 0, like VLLMBackend and OpenAIBackend
    assert isinstance(backend, TrainableBackend)
    [first] = await backend.generate(requests(1), PARAMS)
    assert backend.policy_version == 0 and first.policy_version == 0
    unversioned = ScriptedBackend(lambda r: "a", policy_version=None)
    [untagged] = await unversioned.generate(requests(1), PARAMS)
    assert unversioned.policy_version is None and untagged.policy_version is None
    await backend.update_weights([], version=4)
    [tagged] = await backend.generate(requests(1), PARAMS)
    assert tagged.policy_version == 4 and tagged.policy_versions == (4,)
    # a policy's own version wins; an explicit start version is honoured
    own = ScriptedBackend(lambda r: Completion(text="x", policy_version=9), policy_version=1)
    assert [c.policy_version for c in await own.generate(requests(2), PARAMS)] == [9, 9]
    assert backend.weight_updates == [(4, "keep")]


@pytest.mark.parametrize(("mode", "expected"), [("keep", 1), ("wait", 0)])
async def test_keep_tags_an_in_flight_call_with_the_new_version_wait_with_the_old(
    mode: str, expected: int
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def policy(r: GenerationRequest) -> str:
        started.set()
        await release.wait()
        return "done"

    backend = ScriptedBackend(policy, policy_version=0)
    call = asyncio.create_task(backend.generate(requests(2), PARAMS))
    await started.wait()
    update = asyncio.create_task(backend.update_weights([], version=1, mode=mode))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # one loop turn: the update runs up to its first wait
    # wait holds the switch (and new calls) until the call in flight is done
    assert backend.policy_version == (1 if mode == "keep" else 0)
    release.set()
    outs = await call
    await update
    assert [c.policy_version for c in outs] == [expected, expected]
    assert backend.policy_version == 1


async def test_update_weights_refuses_bad_mode_and_version() -> None:
    backend = ScriptedBackend(lambda r: "a")
    with pytest.raises(ValueError, match="'sync'"):
        await backend.update_weights([], version=1, mode="sync")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="version must be an int"):
        await backend.update_weights([], version="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy_version"):
        ScriptedBackend(lambda r: "a", policy_version=1.5)  # type: ignore[arg-type]
    assert backend.policy_version == 0  # unchanged by the refused updates


@dataclass
class Span:  # vLLM's WeightVersionSpan
    version: str
    start: int
    end: int


@dataclass
class Output:  # the fields of vLLM's CompletionOutput that to_completion reads
    text: str
    token_ids: list[int]
    weight_versions: list[Span]
    logprobs: None = None
    finish_reason: str = "length"


@dataclass
class RequestOutput:
    outputs: list[Output]
    prompt_token_ids: list[int]


def test_vllm_weight_version_spans_become_int_spans() -> None:
    spans = [Span("default", 0, 2), Span("3", 2, 3)]
    out = RequestOutput(outputs=[Output("ab", [5, 6, 7], spans)], prompt_token_ids=[1])
    c = to_completion(out, "r", version=3, initial_version=0)
    assert c.version_spans == ((0, 0, 2), (3, 2, 3))
    assert c.policy_version == 3 and c.policy_versions == (0, 3)
    # no spans reported: the backend's version; an unversioned backend drops "default" labels
    assert engine_spans(None, 0) == ()
    assert engine_spans([Span("default", 0, 1)], None) == ()


async def test_weights_file_copies_tensors_and_cleans_up() -> None:
    torch = pytest.importorskip("torch", reason="run 'make vllm' (it brings torch)")
    from safetensors.torch import load_file

    weight = torch.nn.Parameter(torch.ones(2, 3))
    async with weights_file([("w", weight), ("tied", weight)], None) as directory:
        loaded = load_file(f"{directory}/model.safetensors")
        with torch.no_grad():
            weight.add_(1)  # the file holds the values at call time, not a live alias
    assert torch.equal(loaded["w"], torch.ones(2, 3)) and torch.equal(loaded["tied"], loaded["w"])
    assert not os.path.exists(directory)
    with pytest.raises(TypeError, match=r"\(str, torch.Tensor\)"):
        async with weights_file([("w", [1.0])], None):
            pass


async def test_vllm_update_needs_an_engine_with_the_pause_api() -> None:
    torch = pytest.importorskip("torch", reason="run 'make vllm' (it brings torch)")

    from llenvs_async.backends.vllm import VLLMBackend
    from llenvs_async.errors import BackendError
    from llenvs_async.testing.fake_vllm import FakeAsyncLLM

    backend = VLLMBackend(FakeAsyncLLM())
    with pytest.raises(BackendError, match="lacks pause_generation"):
        await backend.update_weights([("w", torch.ones(1))], version=1)
    assert backend.policy_version == 0


async def test_vllm_swap_keeps_the_load_error_and_notes_the_failed_resume() -> None:
    torch = pytest.importorskip("torch", reason="run 'make vllm' (it brings torch)")

    from llenvs_async.backends.vllm import VLLMBackend
    from llenvs_async.errors import BackendError
    from llenvs_async.testing.fake_vllm import FakeAsyncLLM

    class Updatable(FakeAsyncLLM):
        """The pause API of ``AsyncLLM``: the load and the resume both fail."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
            self.calls.append(f"pause {mode}")

        async def collective_rpc(self, method: str, kwargs: dict[str, str]) -> None:
            self.calls.append(method)
            raise RuntimeError("load exploded")

        async def reset_prefix_cache(self, *, reset_running_requests: bool) -> None:
            self.calls.append("reset")

        async def update_weight_version(self, version: str) -> None:
            self.calls.append(f"label {version}")

        async def resume_generation(self) -> None:
            self.calls.append("resume")
            raise RuntimeError("resume exploded")

    engine = Updatable()
    backend = VLLMBackend(engine)
    with pytest.raises(BackendError, match="load exploded") as caught:
        await backend.update_weights([("w", torch.ones(1))], version=1, mode="wait")
    assert engine.calls == ["pause wait", "reload_weights", "resume"]
    assert isinstance(caught.value.__cause__, RuntimeError)
    notes = caught.value.__cause__.__notes__
    assert notes == ["resuming the engine afterwards failed too: RuntimeError: resume exploded"]
    assert backend.policy_version == 0
    with pytest.raises(ValueError, match="VLLMBackend update_timeout must be > 0"):
        VLLMBackend(engine, update_timeout=-1)
