"""OpenAI-compatible HTTP backend (``vllm serve``, SGLang, ...) over one pooled httpx client.

Chat mode sends one ``/chat/completions`` request per conversation, concurrently
(bounded by ``max_concurrency``); completions mode sends ONE ``/completions``
request carrying the whole batch as a list of prompts. 429, 408, 5xx, connection
errors and timeouts are retried with exponential backoff and jitter (honouring
``Retry-After``); other 4xx replies and malformed bodies raise ``BackendError``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import httpx

from .._resource import AsyncResource
from ..errors import BackendError, BackendTimeoutError, ClosedError
from ..types import ChatMessage, Completion, GenerationRequest, SamplingParams
from ._concurrency import gather_in_order
from ._openai_wire import (
    MalformedResponse,
    Prompt,
    chat_payload,
    completions_payload,
    parse_chat_response,
    parse_completions_response,
    render_plain_prompt,
)

__all__ = ["OpenAIBackend", "render_plain_prompt"]

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({408, 429})
_SNIPPET = 500


class OpenAIBackend(AsyncResource):
    """A ``Backend`` for any OpenAI-compatible server.

    ``base_url`` is the API root as OpenAI clients take it (``http://host:8000/v1``);
    a URL without a path gets ``/v1`` appended. With ``vllm_extras`` the requests ask
    for ``return_token_ids`` so completions carry token ids; logprobs are requested
    whenever ``SamplingParams.logprobs`` is not None. In chat mode a request's
    ``prompt_token_ids`` are ignored (the server templates the messages); in
    completions mode they are sent as the prompt, else ``prompt_renderer(messages)``
    (default ``render_plain_prompt``). A ``client`` passed in stays the caller's: it
    is not closed by ``aclose``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        mode: Literal["chat", "completions"] = "chat",
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_concurrency: int = 256,
        vllm_extras: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        prompt_renderer: Callable[[Sequence[ChatMessage]], str] = render_plain_prompt,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if mode not in ("chat", "completions"):
            raise ValueError(f"OpenAIBackend mode must be 'chat' or 'completions', got {mode!r}")
        if timeout <= 0:
            raise ValueError(f"OpenAIBackend timeout must be > 0, got {timeout!r}")
        if max_retries < 0:
            raise ValueError(f"OpenAIBackend max_retries must be >= 0, got {max_retries!r}")
        if backoff < 0 or max_backoff < 0:
            raise ValueError(f"OpenAIBackend backoff must be >= 0, got {backoff!r}/{max_backoff!r}")
        if max_concurrency < 1:
            raise ValueError(f"OpenAIBackend max_concurrency must be >= 1, got {max_concurrency!r}")
        self.base_url = _api_root(base_url)
        self.model = model
        self.mode = mode
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.vllm_extras = vllm_extras
        self.extra_body: Mapping[str, Any] = MappingProxyType(dict(extra_body or {}))
        self._prompt_renderer = prompt_renderer
        self._timeout = httpx.Timeout(timeout)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=self._timeout,
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        )
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._random = random.Random()
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, mode={self.mode!r})"
        )

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        """One completion per request, in request order."""
        if self._closed:
            raise ClosedError("OpenAIBackend")
        if not requests:
            return []
        if self.mode == "chat":
            return await gather_in_order(self._chat(r, params) for r in requests)
        return await self._completions(requests, params)

    async def _chat(self, request: GenerationRequest, params: SamplingParams) -> Completion:
        url = f"{self.base_url}/chat/completions"
        payload = chat_payload(
            self.model, request, params, vllm_extras=self.vllm_extras, extra_body=self.extra_body
        )
        response = await self._post(url, payload)
        return _parse(response, parse_chat_response)

    async def _completions(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        """ONE request for the batch; a batch mixing token-id and text prompts needs two."""
        prompts: list[Prompt] = [
            list(r.prompt_token_ids)
            if r.prompt_token_ids is not None
            else self._prompt_renderer(r.messages)
            for r in requests
        ]
        groups: dict[bool, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(isinstance(prompt, list), []).append(i)
        parts = await gather_in_order(
            self._completions_group([prompts[i] for i in idx], params) for idx in groups.values()
        )
        results: dict[int, Completion] = {}
        for idx, completions in zip(groups.values(), parts, strict=True):
            results.update(zip(idx, completions, strict=True))
        return [results[i] for i in range(len(requests))]

    async def _completions_group(
        self, prompts: Sequence[Prompt], params: SamplingParams
    ) -> list[Completion]:
        url = f"{self.base_url}/completions"
        payload = completions_payload(
            self.model, prompts, params, vllm_extras=self.vllm_extras, extra_body=self.extra_body
        )
        response = await self._post(url, payload)
        return _parse(response, lambda data: parse_completions_response(data, len(prompts)))

    async def _post(self, url: str, payload: Mapping[str, Any]) -> httpx.Response:
        """POST with retries; returns a 2xx response or raises ``BackendError``."""
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with self._semaphore:
                    response = await self._client.post(
                        url, json=payload, headers=self._headers, timeout=self._timeout
                    )
            except httpx.TimeoutException as exc:
                if attempt >= self.max_retries:
                    raise BackendTimeoutError(
                        f"POST {url} timed out after {attempt + 1} attempt(s) "
                        f"({type(exc).__name__}, timeout {self._timeout.read}s)",
                        url=url,
                    ) from exc
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise BackendError(f"POST {url} cannot be sent: {exc}", url=url) from exc
            except httpx.TransportError as exc:
                if attempt >= self.max_retries:
                    raise BackendError(
                        f"POST {url} failed after {attempt + 1} attempt(s): "
                        f"{type(exc).__name__}: {exc}",
                        url=url,
                    ) from exc
            except httpx.HTTPError as exc:
                raise BackendError(
                    f"POST {url} failed: {type(exc).__name__}: {exc}", url=url
                ) from exc
            else:
                status = response.status_code
                if status < 300:
                    return response
                retryable = status in _RETRYABLE_STATUS or status >= 500
                if not retryable or attempt >= self.max_retries:
                    tries = f" after {attempt + 1} attempt(s)" if retryable else ""
                    raise BackendError(
                        f"POST {url} failed with HTTP {status}{tries}: {_snippet(response.text)}",
                        status_code=status,
                        url=url,
                        body=response.text,
                    )
                retry_after = _retry_after(response.headers.get("retry-after"))
            await self._sleep(self._delay(attempt, retry_after))
            attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """``Retry-After`` when the server sent one, else exponential backoff with jitter."""
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + self._random.uniform(0, ceiling / 2)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the HTTP client (when we created it); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()


def _api_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OpenAIBackend base_url must be an http(s) URL, got {base_url!r}")
    return url if parts.path else f"{url}/v1"


def _parse(response: httpx.Response, parser: Callable[[Any], T]) -> T:
    """Decode JSON and run ``parser``; any shape problem becomes a ``BackendError``."""
    url = str(response.request.url)
    try:
        return parser(response.json())
    except (json.JSONDecodeError, UnicodeDecodeError, MalformedResponse) as exc:
        reason = "the body is not JSON" if not isinstance(exc, MalformedResponse) else str(exc)
        raise BackendError(
            f"POST {url} returned a malformed body (HTTP {response.status_code}): {reason}; "
            f"body: {_snippet(response.text)}",
            status_code=response.status_code,
            url=url,
            body=response.text,
        ) from exc


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _SNIPPET else text[:_SNIPPET] + "...")


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
