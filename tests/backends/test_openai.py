"""OpenAIBackend against a real OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
import socket

import httpx
import pytest

from llenvs_async.backends.openai import OpenAIBackend, render_plain_prompt
from llenvs_async.errors import BackendError, BackendTimeoutError, ClosedError
from llenvs_async.testing.openai_server import (
    Fault,
    fake_logprob,
    fake_token_ids,
    serve_openai_compatible,
)
from llenvs_async.types import ChatMessage, GenerationRequest, SamplingParams

PARAMS = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=3)


def request(text: str, *, token_ids: tuple[int, ...] | None = None) -> GenerationRequest:
    return GenerationRequest(
        messages=(
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content=text),
        ),
        prompt_token_ids=token_ids,
    )


def backend(url: str, **kwargs: object) -> OpenAIBackend:
    options: dict[str, object] = {"backoff": 0.0, "api_key": "sk-test"}
    options.update(kwargs)
    return OpenAIBackend(url, "fake-model", **options)  # type: ignore[arg-type]


async def test_chat_batch_is_sent_concurrently_and_returned_in_order() -> None:
    n = 8
    async with (
        serve_openai_compatible(hold_until_in_flight=n) as server,
        backend(server.base_url) as llm,
    ):
        completions = await llm.generate([request(f"task {i}") for i in range(n)], PARAMS)
    assert server.max_in_flight == n
    assert [r.path for r in server.requests] == ["/v1/chat/completions"] * n
    assert [c.text for c in completions] == [f"echo: task {i}" for i in range(n)]


async def test_chat_concurrency_is_bounded_by_max_concurrency() -> None:
    # The server holds requests until 3 are in flight (never, if the bound holds) or 1 s
    # passes; a user client allows 100 connections, so only the backend's bound limits them.
    async with (
        serve_openai_compatible(hold_until_in_flight=3, hold_timeout=1.0) as server,
        httpx.AsyncClient() as client,
        backend(server.base_url, max_concurrency=2, client=client) as llm,
    ):
        completions = await llm.generate([request(f"t{i}") for i in range(6)], PARAMS)
    assert len(completions) == 6
    assert len(server.requests) == 6
    assert server.max_in_flight == 2


async def test_chat_parses_token_ids_logprobs_and_finish_reason() -> None:
    async with serve_openai_compatible() as server, backend(server.base_url) as llm:
        [full, cut] = await llm.generate([request("hi"), request("x" * 100)], PARAMS)
    assert full.text == "echo: hi"
    assert full.token_ids == tuple(fake_token_ids("echo: hi"))
    assert full.logprobs == tuple(fake_logprob(t) for t in full.token_ids)
    assert full.finish_reason == "stop"
    assert full.prompt_token_ids == tuple(fake_token_ids("<system>be brief<user>hi"))
    assert cut.finish_reason == "length"
    assert len(cut.text) == len(cut.token_ids) == len(cut.logprobs or ()) == 64


async def test_chat_payload_maps_sampling_params_and_extras(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    params = SamplingParams(max_tokens=5, top_k=7, stop=("\n",), seed=11, logprobs=2)
    async with (
        serve_openai_compatible() as server,
        OpenAIBackend(server.base_url, "m", extra_body={"min_p": 0.1, "n": 1}) as llm,
    ):
        await llm.generate([request("a")], params)
        await llm.generate([request("b")], SamplingParams(top_k=-1, logprobs=None))
    first, second = (r.json for r in server.requests)
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"
    assert first["model"] == "m"
    assert first["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
    ]
    assert (first["max_tokens"], first["top_k"], first["stop"], first["seed"]) == (5, 7, ["\n"], 11)
    assert (first["logprobs"], first["top_logprobs"], first["return_token_ids"]) == (True, 2, True)
    assert first["min_p"] == 0.1
    assert "top_k" not in second and "logprobs" not in second and "seed" not in second


async def test_vllm_extras_off_sends_a_plain_request() -> None:
    async with (
        serve_openai_compatible() as server,
        backend(server.base_url, vllm_extras=False) as llm,
    ):
        [completion] = await llm.generate([request("a")], PARAMS)
    assert "return_token_ids" not in server.requests[0].json
    assert completion.text == "echo: a"
    assert completion.token_ids == ()


async def test_completions_mode_sends_one_request_and_maps_choices_by_index() -> None:
    n = 6
    async with (
        serve_openai_compatible(reverse_choices=True) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        completions = await llm.generate([request(f"task {i}") for i in range(n)], PARAMS)
    assert len(server.requests) == 1
    sent = server.requests[0]
    assert sent.path == "/v1/completions"
    assert sent.json["prompt"] == [
        render_plain_prompt(request(f"task {i}").messages) for i in range(n)
    ]
    assert sent.json["logprobs"] == 0
    for i, completion in enumerate(completions):
        expected = f"echo: {render_plain_prompt(request(f'task {i}').messages)}"[:64]
        assert completion.text == expected
        assert completion.token_ids == tuple(fake_token_ids(expected))
        assert completion.logprobs == tuple(fake_logprob(t) for t in completion.token_ids)
        assert completion.prompt_token_ids == tuple(fake_token_ids(sent.json["prompt"][i]))


async def test_completions_mode_sends_prompt_token_ids_when_given() -> None:
    ids = tuple(fake_token_ids("abc"))
    async with (
        serve_openai_compatible() as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        token_only = await llm.generate([request("x", token_ids=ids)] * 3, PARAMS)
        mixed = await llm.generate([request("x", token_ids=ids), request("plain")], PARAMS)
    assert server.requests[0].json["prompt"] == [list(ids)] * 3
    assert [c.text for c in token_only] == ["echo: abc"] * 3
    assert token_only[0].prompt_token_ids == ids
    # A batch mixing token-id and text prompts needs one request per kind.
    assert len(server.requests) == 3
    assert [c.text for c in mixed] == [
        "echo: abc",
        "echo: " + render_plain_prompt(request("plain").messages),
    ]


async def test_retries_server_errors_then_succeeds() -> None:
    async with (
        serve_openai_compatible(faults=[Fault.http_error(500, times=2)]) as server,
        backend(server.base_url) as llm,
    ):
        [completion] = await llm.generate([request("again")], PARAMS)
    assert len(server.requests) == 3
    assert completion.text == "echo: again"


async def test_gives_up_after_max_retries_with_the_last_status() -> None:
    async with (
        serve_openai_compatible(
            faults=[Fault.http_error(503, message="overloaded", times=9)]
        ) as server,
        backend(server.base_url, max_retries=2) as llm,
    ):
        with pytest.raises(BackendError) as info:
            await llm.generate([request("x")], PARAMS)
    assert len(server.requests) == 3
    assert info.value.status_code == 503
    assert "HTTP 503 after 3 attempt(s)" in str(info.value)
    assert "overloaded" in str(info.value)


async def test_429_honours_retry_after() -> None:
    delays: list[float] = []

    async def record_sleep(seconds: float) -> None:
        delays.append(seconds)

    fault = Fault.http_error(429, headers={"Retry-After": "7"})
    async with serve_openai_compatible(faults=[fault]) as server, backend(server.base_url) as llm:
        llm._sleep = record_sleep
        [completion] = await llm.generate([request("x")], PARAMS)
    assert delays == [7.0]
    assert len(server.requests) == 2
    assert completion.text == "echo: x"


async def test_backoff_grows_exponentially_with_jitter() -> None:
    delays: list[float] = []

    async def record_sleep(seconds: float) -> None:
        delays.append(seconds)

    async with (
        serve_openai_compatible(faults=[Fault.http_error(502, times=3)]) as server,
        backend(server.base_url, backoff=1.0) as llm,
    ):
        llm._sleep = record_sleep
        await llm.generate([request("x")], PARAMS)
    assert len(delays) == 3
    for attempt, delay in enumerate(delays):
        assert 2**attempt / 2 <= delay <= 2**attempt


async def test_400_is_a_clear_error_and_not_retried() -> None:
    fault = Fault.http_error(400, message="temperature must be >= 0")
    async with serve_openai_compatible(faults=[fault]) as server, backend(server.base_url) as llm:
        with pytest.raises(BackendError) as info:
            await llm.generate([request("x")], PARAMS)
    url = f"{server.base_url}/chat/completions"
    message = str(info.value)
    assert len(server.requests) == 1
    assert url in message and "HTTP 400" in message and "temperature must be >= 0" in message
    assert (info.value.status_code, info.value.url) == (400, url)
    assert "temperature must be >= 0" in (info.value.body or "")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>gateway</html>", "not JSON"),
        ({"object": "chat.completion"}, "'choices' is missing"),
        ({"choices": []}, "expected 1 choice(s), got 0"),
        ({"choices": [{"index": 0, "message": {"content": 3}}]}, "content is not a string"),
    ],
)
async def test_malformed_chat_body_is_a_clear_error(body: object, reason: str) -> None:
    fault = Fault.malformed(body)  # type: ignore[arg-type]
    async with serve_openai_compatible(faults=[fault]) as server, backend(server.base_url) as llm:
        with pytest.raises(BackendError) as info:
            await llm.generate([request("x")], PARAMS)
    message = str(info.value)
    assert f"{server.base_url}/chat/completions" in message
    assert "malformed body (HTTP 200)" in message and reason in message
    assert len(server.requests) == 1


async def test_completions_with_wrong_choice_count_is_a_clear_error() -> None:
    body = {"choices": [{"index": 0, "text": "only one"}]}
    async with (
        serve_openai_compatible(faults=[Fault.malformed(body)]) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        with pytest.raises(BackendError, match=r"expected 3 choice\(s\), got 1"):
            await llm.generate([request("a"), request("b"), request("c")], PARAMS)


async def test_timeouts_are_retried_then_raise_backend_timeout_error() -> None:
    fault = Fault.delayed(600.0, times=5)
    async with (
        serve_openai_compatible(faults=[fault]) as server,
        backend(server.base_url, timeout=0.2, max_retries=1) as llm,
    ):
        with pytest.raises(BackendTimeoutError) as info:
            await llm.generate([request("slow")], PARAMS)
    assert len(server.requests) == 2
    assert "timed out after 2 attempt(s)" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.TimeoutException)


async def test_connection_refused_is_retried_then_a_backend_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with backend(f"http://127.0.0.1:{port}", max_retries=1) as llm:
        with pytest.raises(BackendError, match="failed after 2 attempt") as info:
            await llm.generate([request("x")], PARAMS)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_one_failed_chat_request_fails_the_batch_without_orphans() -> None:
    # The first request to arrive fails; the other three would hang for 10 minutes.
    faults = [Fault.http_error(422, message="bad prompt"), Fault.delayed(600.0, times=3)]
    async with serve_openai_compatible(faults=faults) as server, backend(server.base_url) as llm:
        with pytest.raises(BackendError, match="HTTP 422"):
            await llm.generate([request(f"t{i}") for i in range(4)], PARAMS)
        other = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert [t for t in other if "OpenAIBackend" in getattr(t.get_coro(), "__qualname__", "")] == []


async def test_closed_backend_raises_closed_error_and_aclose_is_idempotent() -> None:
    async with serve_openai_compatible() as server:
        llm = backend(server.base_url)
        await llm.aclose()
        await llm.aclose()
        with pytest.raises(ClosedError):
            await llm.generate([request("x")], PARAMS)
    assert server.requests == []


async def test_user_client_is_not_closed() -> None:
    async with serve_openai_compatible() as server, httpx.AsyncClient() as client:
        async with OpenAIBackend(server.base_url, "m", client=client) as llm:
            [completion] = await llm.generate([request("x")], PARAMS)
        assert not client.is_closed
        assert completion.text == "echo: x"


async def test_base_url_without_path_gets_v1_and_empty_batch_sends_nothing() -> None:
    async with serve_openai_compatible() as server:
        root = server.base_url.removesuffix("/v1")
        async with backend(root + "/") as llm:
            assert llm.base_url == server.base_url
            assert await llm.generate([], PARAMS) == []
            [completion] = await llm.generate([request("x")], PARAMS)
    assert len(server.requests) == 1
    assert completion.text == "echo: x"


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", mode="stream")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend("127.0.0.1:8000", "m")


def test_null_logprob_becomes_nan() -> None:
    from llenvs_async.backends._openai_wire import parse_completions_response

    data = {"choices": [{"index": 0, "text": "a", "logprobs": {"token_logprobs": [None, -1.5]}}]}
    [completion] = parse_completions_response(data, 1)
    assert completion.logprobs is not None
    assert math.isnan(completion.logprobs[0]) and completion.logprobs[1] == -1.5
