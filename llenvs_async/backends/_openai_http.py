"""One pooled httpx client to one OpenAI-compatible server: POSTs retried, failures mapped,
the context window asked once; apart so the retry policy reads on its own."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from ..errors import BackendError, ContextLengthError
from ._openai_wire import MalformedResponse
from ._outcomes import context_overflow, http_failure, request_error

__all__ = ["ServerClient", "api_root", "is_rejection", "parse_body"]

T = TypeVar("T")

_log = logging.getLogger("llenvs_async.backends.openai")

_RETRYABLE_STATUS = frozenset({408, 429})
_SNIPPET = 500


class ServerClient:
    """POSTs to one server, retried on 429, 408, 5xx, connection errors and timeouts with
    exponential backoff and jitter (honouring ``Retry-After``); a ``client`` passed in stays
    the caller's."""

    def __init__(
        self,
        client: httpx.AsyncClient | None,
        *,
        headers: Mapping[str, str],
        timeout: float,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_concurrency: int,
        context_length: int | None,
    ) -> None:
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = dict(headers)
        self.timeout = httpx.Timeout(timeout)
        self.owns_client = client is None
        self.client = client or httpx.AsyncClient(
            timeout=self.timeout,
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        )
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.random = random.Random()
        self._context_length = context_length
        self._context_known = context_length is not None
        self._context_lock = asyncio.Lock()

    async def post(self, url: str, payload: Mapping[str, Any]) -> httpx.Response:
        """POST with retries; returns a 2xx response or raises ``BackendError``."""
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with self.semaphore:
                    response = await self.client.post(
                        url, json=payload, headers=self.headers, timeout=self.timeout
                    )
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise BackendError(f"POST {url} cannot be sent: {exc}", url=url) from exc
            except httpx.TransportError as exc:  # timeouts included: retried alike
                if attempt >= self.max_retries:
                    raise http_failure("POST", url, exc, attempts=attempt + 1) from exc
            except httpx.HTTPError as exc:
                raise http_failure("POST", url, exc) from exc
            else:
                status = response.status_code
                if status < 300:
                    return response
                retryable = status in _RETRYABLE_STATUS or status >= 500
                if not retryable or attempt >= self.max_retries:
                    tries = f" after {attempt + 1} attempt(s)" if retryable else ""
                    raise request_error(
                        f"POST {url} failed with HTTP {status}{tries}: {_snippet(response.text)}",
                        status_code=status,
                        url=url,
                        body=response.text,
                    )
                retry_after = _retry_after(response.headers.get("retry-after"))
            await self.sleep(self.delay(attempt, retry_after))
            attempt += 1

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """``Retry-After`` when the server sent one, else exponential backoff with jitter."""
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        ceiling = min(self.max_backoff, self.backoff * 2.0**attempt)
        return ceiling / 2 + self.random.uniform(0, ceiling / 2)

    async def post_within_window(self, url: str, payload: Mapping[str, Any]) -> httpx.Response:
        """POST one prompt; when the server rejects it because prompt + ``max_tokens`` is over
        the window and its message states the prompt's length (OpenAI, SGLang, vLLM < 0.10),
        send it once more with ``max_tokens`` = what the prompt leaves."""
        try:
            return await self.post(url, payload)
        except ContextLengthError as exc:
            overflow = context_overflow(f"{exc.message}\n{exc.body or ''}")
            room = overflow.room() if overflow is not None else None
            sent = payload.get("max_tokens")
            if room is None or room < 1 or not isinstance(sent, int) or room >= sent:
                raise
            _log.debug(
                "%s: prompt + max_tokens over the window; max_tokens %d -> %d", url, sent, room
            )
            return await self.post(url, {**payload, "max_tokens": room})

    async def context_length(self, base_url: str, model: str) -> int | None:
        """``context_length``, else ``model``'s ``max_model_len`` in ``GET /models`` (asked once,
        cached), else None; a server that cannot be reached is asked again next time."""
        if not self._context_known:
            async with self._context_lock:
                if not self._context_known:
                    self._context_length = await self._max_model_len(base_url, model)
        return self._context_length

    async def _max_model_len(self, base_url: str, model: str) -> int | None:
        url = f"{base_url}/models"
        try:
            response = await self.client.get(url, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            _log.warning("GET %s failed (%r): the context window is unknown for now", url, exc)
            return None
        self._context_known = True
        if response.status_code >= 300:
            return None
        try:
            entries = response.json().get("data")
        except (ValueError, AttributeError):
            return None
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, Mapping) and entry.get("id") == model:
                value = entry.get("max_model_len")
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    async def aclose(self) -> None:
        """Close the HTTP client when it is ours."""
        if self.owns_client:
            await self.client.aclose()


def is_rejection(exc: BackendError) -> bool:
    """A non-retryable 4xx: the server refused this request's content, not the round."""
    status = exc.status_code
    return status is not None and 400 <= status < 500 and status not in _RETRYABLE_STATUS


def api_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OpenAIBackend base_url must be an http(s) URL, got {base_url!r}")
    return url if parts.path else f"{url}/v1"


def parse_body(response: httpx.Response, parser: Callable[[Any], T]) -> T:
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
