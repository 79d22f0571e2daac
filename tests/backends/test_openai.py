"""OpenAIBackend against a real OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import socket

import httpx
import pytest

from llenvs_async.backends.openai import OpenAIBackend, render_plain_prompt
from llenvs_async.errors import (
    BackendError,
    BackendTimeoutError,
    ClosedError,
    ContextLengthError,
)
from llenvs_async.testing.openai_server import (
    Fault,
    fake_logprob,
    fake_token_ids,
    serve_openai_compatible,
)
from llenvs_async.types import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)

PARAMS = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=3)


def request(
    text: str,
    *,
    token_ids: tuple[int, ...] | None = None,
    seed: int | None = None,
    rollout_index: int = 0,
) -> GenerationRequest:
    return GenerationRequest(
        messages=(
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content=text),
        ),
        prompt_token_ids=token_ids,
        seed=seed,
        rollout_index=rollout_index,
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
        await llm.generate([request("a", seed=11)], params)
        await llm.generate([request("b")], SamplingParams(top_k=-1, logprobs=None, seed=5))
    first, second = (r.json for r in server.requests)
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"
    assert first["model"] == "m"
    assert first["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
    ]
    assert (first["max_tokens"], first["top_k"], first["stop"], first["seed"]) == (5, 7, ["\n"], 11)
    assert (first["logprobs"], first["top_logprobs"], first["return_token_ids"]) == (True, 2, True)
    assert first["include_stop_str_in_output"] is True  # a stop string stays in the text
    assert first["min_p"] == 0.1
    # The seed sent is the request's own; the base seed in params is not sent.
    assert "top_k" not in second and "logprobs" not in second and "seed" not in second
    assert "include_stop_str_in_output" not in second  # no stop string, nothing to keep


async def test_every_request_sends_its_own_seed_in_both_modes() -> None:
    seeds = [101, 102, 101, None]
    batch = [request(f"t{i}", seed=s, rollout_index=i) for i, s in enumerate(seeds)]
    async with serve_openai_compatible() as server:
        async with backend(server.base_url) as llm:
            await llm.generate(batch, PARAMS)
        chat_seeds = sorted(
            (r.json["messages"][1]["content"], r.json.get("seed")) for r in server.requests
        )
        assert chat_seeds == [("t0", 101), ("t1", 102), ("t2", 101), ("t3", None)]
        server.requests.clear()
        async with backend(server.base_url, mode="completions") as llm:
            completions = await llm.generate(batch, PARAMS)
    # One /completions request per seed: prompts sharing a seed (or none) stay batched.
    by_seed = {r.json.get("seed"): r.json["prompt"] for r in server.requests}
    rendered = [render_plain_prompt(r.messages) for r in batch]
    assert by_seed == {101: [rendered[0], rendered[2]], 102: [rendered[1]], None: [rendered[3]]}
    assert [c.text for c in completions] == [f"echo: {p}"[:64] for p in rendered]


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
    # Token-id prompts: the context window is asked once (GET /models, cached).
    assert [(r.method, r.path) for r in server.requests].count(("GET", "/v1/models")) == 1
    posts = [r for r in server.requests if r.method == "POST"]
    assert posts[0].json["prompt"] == [list(ids)] * 3
    assert [c.text for c in token_only] == ["echo: abc"] * 3
    assert token_only[0].prompt_token_ids == ids
    # A batch mixing token-id and text prompts needs one request per kind.
    assert len(posts) == 3
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
        llm._http.sleep = record_sleep
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
        llm._http.sleep = record_sleep
        await llm.generate([request("x")], PARAMS)
    assert len(delays) == 3
    for attempt, delay in enumerate(delays):
        assert 2**attempt / 2 <= delay <= 2**attempt


async def test_a_400_is_that_requests_own_error_naming_it_and_not_retried() -> None:
    fault = Fault.http_error(400, message="temperature must be >= 0")
    async with serve_openai_compatible(faults=[fault]) as server, backend(server.base_url) as llm:
        [outcome] = await llm.generate([request("x", rollout_index=7)], PARAMS)
    url = f"{server.base_url}/chat/completions"
    assert isinstance(outcome, GenerationError)
    assert outcome.request_index == 0
    error = outcome.error
    assert type(error) is BackendError
    message = str(error)
    assert len(server.requests) == 1
    assert "request 0 of the round (rollout 7, step 0)" in message
    assert url in message and "HTTP 400" in message and "temperature must be >= 0" in message
    assert (error.status_code, error.url) == (400, url)
    assert "temperature must be >= 0" in (error.body or "")


async def test_a_prompt_over_the_context_window_is_a_context_length_error_chat() -> None:
    async with (
        serve_openai_compatible(max_model_len=60) as server,
        backend(server.base_url) as llm,
    ):
        short, long = await llm.generate([request("hi"), request("x" * 80)], PARAMS)
    assert isinstance(short, Completion) and short.text == "echo: hi"
    assert isinstance(long, GenerationError) and long.request_index == 1
    assert isinstance(long.error, ContextLengthError)
    assert long.error.status_code == 400
    assert "maximum context length is 60 tokens" in str(long.error)


async def test_completions_batch_with_one_prompt_too_long_fails_only_that_prompt() -> None:
    batch = [request("a"), request("y" * 80), request("b")]
    async with (
        serve_openai_compatible(max_model_len=60) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        first, long, last = await llm.generate(batch, PARAMS)
    # The server rejects the whole list; each prompt is then sent alone.
    assert [len(r.json["prompt"]) for r in server.requests] == [3, 1, 1, 1]
    assert isinstance(first, Completion) and isinstance(last, Completion)
    assert first.text == f"echo: {render_plain_prompt(batch[0].messages)}"
    assert isinstance(long, GenerationError) and long.request_index == 1
    assert isinstance(long.error, ContextLengthError)
    assert "request 1 of the round" in str(long.error)


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


async def test_one_rejected_chat_request_leaves_its_siblings_complete() -> None:
    faults = [Fault.http_error(422, message="bad prompt")]
    async with serve_openai_compatible(faults=faults) as server, backend(server.base_url) as llm:
        outcomes = await llm.generate([request(f"t{i}") for i in range(4)], PARAMS)
    failed = [o for o in outcomes if isinstance(o, GenerationError)]
    assert len(failed) == 1 and failed[0].error.status_code == 422
    assert sorted(o.text for o in outcomes if isinstance(o, Completion)) == sorted(
        f"echo: t{i}" for i in range(4) if i != failed[0].request_index
    )
    assert len(server.requests) == 4


async def test_a_server_error_after_retries_fails_the_round_without_orphans() -> None:
    # The first request to arrive gets a 503 (no retries left); the other three would hang.
    faults = [Fault.http_error(503, message="overloaded"), Fault.delayed(600.0, times=3)]
    async with (
        serve_openai_compatible(faults=faults) as server,
        backend(server.base_url, max_retries=0) as llm,
    ):
        with pytest.raises(BackendError, match="HTTP 503"):
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


BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_the_servers_reasoning_is_kept_under_either_name(field: str) -> None:
    def policy(messages: object) -> dict[str, str]:
        return {"content": "the answer", field: "first, think"}

    async with (
        serve_openai_compatible(policy=policy) as server,
        backend(server.base_url) as llm,
    ):
        [completion] = await llm.generate([request("q")], PARAMS)
        [plain] = await llm.generate([request("q")], PARAMS)  # policy unchanged: same answer
    assert isinstance(completion, Completion) and isinstance(plain, Completion)
    assert completion.text == "the answer"
    assert completion.reasoning == "first, think"
    async with serve_openai_compatible() as server, backend(server.base_url) as llm:
        [none] = await llm.generate([request("q")], PARAMS)
    assert isinstance(none, Completion) and none.reasoning is None


async def test_tool_choice_and_an_assistants_reasoning_go_on_the_wire() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    messages = (
        ChatMessage(role="user", content="list"),
        ChatMessage(role="assistant", content="", tool_calls=(call,), reasoning="ls first"),
        ChatMessage(role="tool", content="a b", tool_call_id="c1"),
    )
    named = {"type": "function", "function": {"name": "bash"}}
    batch = [
        GenerationRequest(messages=messages, tools=(BASH_TOOL,), tool_choice="required"),
        GenerationRequest(messages=messages, tools=(BASH_TOOL,), tool_choice=named),
        GenerationRequest(messages=messages, tools=(BASH_TOOL,)),
    ]
    async with serve_openai_compatible() as server, backend(server.base_url) as llm:
        outcomes = await llm.generate(batch, PARAMS)
    assert all(isinstance(o, Completion) for o in outcomes)
    sent = sorted((r.json for r in server.requests), key=lambda body: str(body.get("tool_choice")))
    assert [body.get("tool_choice") for body in sent] == [None, "required", named]
    for body in sent:
        assert body["messages"][1] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [call],
            "reasoning_content": "ls first",
        }
        assert "reasoning_content" not in body["messages"][2]


async def test_a_tool_choice_the_server_rejects_is_that_requests_error() -> None:
    bad = GenerationRequest(
        messages=(ChatMessage(role="user", content="x"),), tool_choice="required"
    )
    async with serve_openai_compatible() as server, backend(server.base_url) as llm:
        ok, rejected = await llm.generate([request("fine"), bad], PARAMS)
    assert isinstance(ok, Completion)
    assert isinstance(rejected, GenerationError) and rejected.request_index == 1
    assert "`tools` must be set" in str(rejected.error)


def long_answer(prompt: object) -> str:
    return "z" * 200


async def test_chat_max_tokens_over_the_window_is_retried_once_clamped() -> None:
    """OpenAI / vLLM < 0.10 reject prompt + max_tokens over the window, stating both: the
    request goes once more with max_tokens = what the prompt leaves."""
    prompt_tokens = len(fake_token_ids("<system>be brief<user>hi"))  # the server's rendering
    async with (
        serve_openai_compatible(max_model_len=60, overflow="reject", policy=long_answer) as server,
        backend(server.base_url) as llm,
    ):
        [completion] = await llm.generate([request("hi")], PARAMS)
    assert [r.json["max_tokens"] for r in server.requests] == [64, 60 - prompt_tokens]
    assert isinstance(completion, Completion)
    assert completion.text == "z" * (60 - prompt_tokens)
    assert completion.finish_reason == "length"


@pytest.mark.parametrize("overflow", ["reject", "clamp"])
async def test_a_chat_prompt_that_leaves_no_room_is_a_context_length_error(overflow: str) -> None:
    rendered = "<system>be brief<user>"
    filler = "w" * (60 - len(fake_token_ids(rendered)))  # exactly fills the window
    async with (
        serve_openai_compatible(max_model_len=60, overflow=overflow) as server,  # type: ignore[arg-type]
        backend(server.base_url) as llm,
    ):
        full, over = await llm.generate([request(filler), request(filler + "ww")], PARAMS)
    for outcome in (full, over):
        assert isinstance(outcome, GenerationError), outcome
        assert isinstance(outcome.error, ContextLengthError)
        assert outcome.error.status_code == 400
    assert len(server.requests) == 2  # nothing to retry: no room either way


async def test_chat_against_a_clamping_server_needs_no_retry() -> None:
    """vLLM >= 0.10 clamps max_tokens to the window itself."""
    async with (
        serve_openai_compatible(max_model_len=60, overflow="clamp", policy=long_answer) as server,
        backend(server.base_url) as llm,
    ):
        [completion] = await llm.generate([request("hi")], PARAMS)
    assert len(server.requests) == 1
    assert isinstance(completion, Completion)
    assert len(completion.text) == 60 - len(fake_token_ids("<system>be brief<user>hi"))


async def test_completions_token_prompts_are_clamped_to_the_window_from_models() -> None:
    window = 60
    lengths = [10, 50, 60, 70, 10]
    batch = [
        request("x", token_ids=tuple(fake_token_ids("p" * n)), rollout_index=i)
        for i, n in enumerate(lengths)
    ]
    async with (
        serve_openai_compatible(max_model_len=window, policy=long_answer) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        outcomes = await llm.generate(batch, PARAMS)
        assert await llm.get_context_length() == window
        again = await llm.generate(batch[:1], PARAMS)
    gets = [r for r in server.requests if r.method == "GET"]
    assert [r.path for r in gets] == ["/v1/models"]  # asked once, cached
    posts = [r.json for r in server.requests if r.method == "POST"]
    # One request per clamped max_tokens (the two 10-token prompts share one); the prompts
    # that leave no room are never sent.
    assert sorted((p["max_tokens"], len(p["prompt"])) for p in posts) == [(10, 1), (50, 1), (50, 2)]
    for n, outcome in zip(lengths, outcomes, strict=True):
        if n >= window:
            assert isinstance(outcome, GenerationError) and isinstance(
                outcome.error, ContextLengthError
            )
            assert "not sent" in str(outcome.error)
        else:
            assert isinstance(outcome, Completion)
            assert len(outcome.token_ids) == window - n
            assert outcome.finish_reason == "length"
    assert isinstance(again[0], Completion)


async def test_completions_context_length_argument_is_used_without_asking() -> None:
    ids = tuple(fake_token_ids("p" * 30))
    async with (
        serve_openai_compatible(policy=long_answer) as server,
        backend(server.base_url, mode="completions", context_length=40) as llm,
    ):
        [completion] = await llm.generate([request("x", token_ids=ids)], PARAMS)
    assert [r.method for r in server.requests] == ["POST"]
    assert server.requests[0].json["max_tokens"] == 10
    assert isinstance(completion, Completion) and len(completion.token_ids) == 10


async def test_a_models_route_that_fails_leaves_the_window_unknown() -> None:
    ids = tuple(fake_token_ids("p" * 30))
    async with (
        serve_openai_compatible(faults=[Fault.http_error(404)]) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        await llm.generate([request("x", token_ids=ids)], PARAMS)
        await llm.generate([request("x", token_ids=ids)], PARAMS)
        assert await llm.get_context_length() is None
    assert [r.method for r in server.requests] == ["GET", "POST", "POST"]
    assert [r.json["max_tokens"] for r in server.requests[1:]] == [64, 64]


async def test_completions_text_prompt_over_the_window_is_retried_clamped() -> None:
    async with (
        serve_openai_compatible(max_model_len=60, overflow="reject", policy=long_answer) as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        [completion] = await llm.generate([request("hi")], PARAMS)
    prompt = len(fake_token_ids(render_plain_prompt(request("hi").messages)))
    assert [r.json["max_tokens"] for r in server.requests] == [64, 60 - prompt]
    assert isinstance(completion, Completion) and len(completion.text) == 60 - prompt


async def test_completions_mode_refuses_a_forced_tool_choice_per_request() -> None:
    forced = GenerationRequest(
        messages=(ChatMessage(role="user", content="x"),),
        tools=(BASH_TOOL,),
        tool_choice="required",
    )
    async with (
        serve_openai_compatible() as server,
        backend(server.base_url, mode="completions") as llm,
    ):
        ok, refused = await llm.generate([request("fine"), forced], PARAMS)
    assert isinstance(ok, Completion)
    assert isinstance(refused, GenerationError) and refused.request_index == 1
    assert "completions route takes no tool_choice" in str(refused.error)
    assert len(server.requests) == 1


def test_parser_and_context_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="in chat mode the server parses"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", reasoning_parser="qwen3")
    with pytest.raises(ValueError, match="need tokenizer="):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", mode="completions", tool_call_parser="hermes")
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match="context_length"):
            OpenAIBackend("http://127.0.0.1:1/v1", "m", context_length=bad)  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_an_unknown_parser_name_lists_vllms_names() -> None:
    with pytest.raises(ValueError, match=r"reasoning_parser='qwen9' .*\bqwen3\b"):
        OpenAIBackend(
            "http://127.0.0.1:1/v1", "m", mode="completions", tokenizer=object(),
            reasoning_parser="qwen9",
        )  # fmt: skip
