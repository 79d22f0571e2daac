"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests and examples (stdlib asyncio).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (list prompts, choice
index ``prompt_i * n + j``) like ``vllm serve``: deterministic fake token ids (one
per character, see ``fake_token_ids``), logprobs and ``return_token_ids``, and
``GET /v1/models`` (with ``max_model_len`` when the server has one). It records every
request, counts the most requests in flight at once, and injects faults (HTTP errors,
``Retry-After``, malformed bodies, delays) in FIFO order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Literal

from ._chat_schema import chat_schema_error
from ._fake_model import (
    default_policy,
    detokenize,
    fake_logprob,
    fake_token_ids,
    is_token_list,
    render_chat,
    requested_max_tokens,
    sample,
)
from ._http1 import BadRequest, error_body, read_request, write_response

__all__ = [
    "Fault",
    "OpenAITestServer",
    "RecordedRequest",
    "ServerPolicy",
    "default_policy",
    "fake_logprob",
    "fake_token_ids",
    "serve_openai_compatible",
]

ServerPolicy = Callable[[Any], "str | Mapping[str, Any]"]
"""Gets the chat ``messages`` list or one completions ``prompt`` (str or token ids).

For a chat it may return ``{"content": ..., "tool_calls": [...]}`` to call tools, and
``"reasoning"`` (vLLM >= 0.10's field) or ``"reasoning_content"`` (older vLLM, DeepSeek)
to return reasoning next to the content (copied into the message as given)."""

Overflow = Literal["ignore", "clamp", "reject"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One injected misbehaviour, applied to the next ``times`` requests.

    ``delay_s`` waits first; then ``status_code``/``body``/``headers`` replace the
    reply (a ``None`` status means "the normal reply, late").
    """

    status_code: int | None = None
    body: bytes | Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    delay_s: float = 0.0
    times: int = 1

    @classmethod
    def http_error(
        cls,
        status_code: int,
        *,
        message: str = "injected fault",
        headers: Mapping[str, str] | None = None,
        times: int = 1,
    ) -> Fault:
        """An error reply with an OpenAI-style error body."""
        body = error_body(status_code, message)
        return cls(status_code=status_code, body=body, headers=dict(headers or {}), times=times)

    @classmethod
    def malformed(
        cls, body: bytes | Mapping[str, Any] = b"<html>not json", *, times: int = 1
    ) -> Fault:
        """A 200 reply whose body is not a valid completion response."""
        return cls(status_code=200, body=body, times=times)

    @classmethod
    def delayed(cls, seconds: float, *, times: int = 1) -> Fault:
        """The normal reply, ``seconds`` late (use far more than the client timeout)."""
        return cls(delay_s=seconds, times=times)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request as the server received it; ``json`` is the decoded body (None if not JSON)."""

    method: str
    path: str
    headers: Mapping[str, str]
    json: Any


class OpenAITestServer:
    """The server; use ``async with serve_openai_compatible(...) as server: server.base_url``.

    ``hold_until_in_flight=N`` makes requests wait until N are in flight at once (or
    ``hold_timeout`` passes; then holding stops), so a test can prove that a batch is
    concurrent, or, with N above a client's bound, that the bound holds.
    ``reverse_choices`` returns completions choices in reverse order (clients must
    map them by ``index``). ``max_model_len`` rejects, like vLLM (HTTP 400, its
    message), a request with any prompt longer than that many fake tokens; ``overflow``
    says what happens to a prompt that fits but whose ``max_tokens`` does not:
    ``"ignore"`` (nothing), ``"clamp"`` (vLLM >= 0.10: ``max_tokens`` is cut to what the
    prompt leaves, and a prompt filling the window is its 400 "max_tokens must be at least
    1, got 0") or ``"reject"`` (OpenAI and vLLM < 0.10: a 400 stating the prompt's tokens
    and the completion's).
    """

    def __init__(
        self,
        *,
        policy: ServerPolicy = default_policy,
        faults: Iterable[Fault] = (),
        hold_until_in_flight: int | None = None,
        hold_timeout: float = 10.0,
        reverse_choices: bool = False,
        max_model_len: int | None = None,
        model: str = "fake-model",
        overflow: Overflow = "ignore",
    ) -> None:
        self.policy = policy
        self.max_model_len = max_model_len
        self.overflow = overflow
        self.model = model
        self.reverse_choices = reverse_choices
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: deque[list[Any]] = deque()
        for fault in faults:
            self.inject(fault)
        self._hold_until = hold_until_in_flight
        self._hold_timeout = hold_timeout
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        """The API root, as OpenAI clients take it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, fault: Fault) -> None:
        """Queue a fault behind those already queued."""
        self._faults.append([fault, fault.times])

    async def start(self) -> None:
        """Listen on an ephemeral port of 127.0.0.1."""
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def aclose(self) -> None:
        """Stop listening and cancel every open connection (delayed replies included)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> OpenAITestServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while (request := await read_request(reader)) is not None:
                method, path, headers, body = request
                status, extra, payload = await self._respond(method, path, headers, body)
                await write_response(writer, status, extra, payload)
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, BadRequest):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _respond(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Mapping[str, str], bytes]:
        try:
            decoded: Any = json.loads(body) if body else None
        except ValueError:
            decoded = None
        self.requests.append(
            RecordedRequest(method, path, MappingProxyType(dict(headers)), decoded)
        )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._hold()
            fault = self._next_fault()
            if fault is not None and fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.status_code is not None:
                raw = fault.body
                payload = raw if isinstance(raw, bytes) else json.dumps(dict(raw or {})).encode()
                return fault.status_code, fault.headers, payload
            status, reply = self._route(method, path, decoded)
            return status, {}, json.dumps(reply).encode()
        finally:
            self.in_flight -= 1

    async def _hold(self) -> None:
        if self._hold_until is None:
            return
        if self.in_flight >= self._hold_until:
            self._released.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._hold_timeout):
                await self._released.wait()
        self._released.set()  # after a timeout, stop holding anyone

    def _next_fault(self) -> Fault | None:
        if not self._faults:
            return None
        entry = self._faults[0]
        entry[1] -= 1
        if entry[1] <= 0:
            self._faults.popleft()
        fault: Fault = entry[0]
        return fault

    def _route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == "/v1/models":
            entry: dict[str, Any] = {"id": self.model, "object": "model"}
            if self.max_model_len is not None:
                entry["max_model_len"] = self.max_model_len
            return 200, {"object": "list", "data": [entry]}
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return 404, error_body(404, f"no route for {method} {path}")
        if not isinstance(body, dict):
            return 400, error_body(400, "the request body is not a JSON object")
        if path == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return 400, error_body(400, "'messages' must be a non-empty list")
            problem = chat_schema_error(messages, body.get("tools"), body.get("tool_choice"))
            if problem is not None:
                return 400, error_body(400, problem)
            too_long = self._context_error([fake_token_ids(render_chat(messages))], body)
            return too_long or (200, self._chat(body, messages))
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and not is_token_list(prompt) else [prompt]
        if not prompts or not all(isinstance(p, str) or is_token_list(p) for p in prompts):
            return 400, error_body(400, "'prompt' must be a string, token ids, or a list of those")
        too_long = self._context_error(
            [p if isinstance(p, list) else fake_token_ids(str(p)) for p in prompts], body
        )
        return too_long or (200, self._completions(body, prompts))

    def _context_error(
        self, prompt_ids: list[list[int]], body: Mapping[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """vLLM's 400 for a prompt over ``max_model_len`` (one bad prompt fails the list);
        then what ``overflow`` says for a ``max_tokens`` the window cannot hold."""
        window = self.max_model_len
        longest = max(len(ids) for ids in prompt_ids)
        if window is None:
            return None
        if longest > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, "
                f"your prompt contains {longest} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt."
            )
            return 400, error_body(400, message)
        asked = requested_max_tokens(body)
        if self.overflow == "clamp" and longest == window:
            return 400, error_body(400, "max_tokens must be at least 1, got 0.")
        if self.overflow == "reject" and longest + asked > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {longest + asked} tokens ({longest} in the messages, {asked} in "
                "the completion). Please reduce the length of the messages or completion."
            )
            return 400, error_body(400, message)
        return None

    def _room(self, prompt_ids: list[int], body: Mapping[str, Any]) -> int:
        """The ``max_tokens`` a prompt gets: the request's, clamped to the window if so."""
        asked = requested_max_tokens(body)
        if self.overflow == "clamp" and self.max_model_len is not None:
            return min(asked, self.max_model_len - len(prompt_ids))
        return asked

    def _chat(self, body: Mapping[str, Any], messages: list[Any]) -> dict[str, Any]:
        rendered = render_chat(messages)
        room = self._room(fake_token_ids(rendered), body)
        choices = []
        for j in range(int(body.get("n") or 1)):
            answer = self.policy(messages)
            calls = answer.get("tool_calls") if isinstance(answer, Mapping) else None
            said = str(answer.get("content") or "") if isinstance(answer, Mapping) else answer
            text, ids, finish = sample(said, body, room)
            choice: dict[str, Any] = {
                "index": j,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            if isinstance(answer, Mapping):
                for key in ("reasoning", "reasoning_content"):
                    if key in answer:
                        choice["message"][key] = answer[key]
            if calls:
                choice["message"]["tool_calls"] = list(calls)
                choice["finish_reason"] = "tool_calls"
            if body.get("logprobs"):
                content = [{"token": detokenize([t]), "logprob": fake_logprob(t)} for t in ids]
                choice["logprobs"] = {"content": content}
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        reply: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
        }
        reply.update(model=self.model, choices=choices)
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = fake_token_ids(rendered)
        return reply

    def _completions(self, body: Mapping[str, Any], prompts: list[Any]) -> dict[str, Any]:
        n = int(body.get("n") or 1)
        choices = []
        for i, prompt in enumerate(prompts):
            prompt_ids = prompt if isinstance(prompt, list) else fake_token_ids(prompt)
            room = self._room(prompt_ids, body)
            for j in range(n):
                text, ids, finish = sample(str(self.policy(prompt)), body, room)
                choice: dict[str, Any] = {
                    "index": i * n + j,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                }
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "tokens": [detokenize([t]) for t in ids],
                        "token_logprobs": [fake_logprob(t) for t in ids],
                    }
                if body.get("return_token_ids"):
                    choice["token_ids"] = ids
                    choice["prompt_token_ids"] = prompt_ids
                choices.append(choice)
        if self.reverse_choices:
            choices.reverse()
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "model": self.model,
            "choices": choices,
        }


def serve_openai_compatible(
    *,
    policy: ServerPolicy = default_policy,
    faults: Iterable[Fault] = (),
    hold_until_in_flight: int | None = None,
    hold_timeout: float = 10.0,
    reverse_choices: bool = False,
    max_model_len: int | None = None,
    model: str = "fake-model",
    overflow: Overflow = "ignore",
) -> OpenAITestServer:
    """A not-yet-started server: ``async with serve_openai_compatible(...) as server``."""
    return OpenAITestServer(
        policy=policy,
        faults=faults,
        hold_until_in_flight=hold_until_in_flight,
        hold_timeout=hold_timeout,
        reverse_choices=reverse_choices,
        max_model_len=max_model_len,
        model=model,
        overflow=overflow,
    )
