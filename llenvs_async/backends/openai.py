"""OpenAI-compatible HTTP backend (``vllm serve``, SGLang, ...) over one pooled httpx client.

Chat mode sends one ``/chat/completions`` request per conversation, concurrently
(bounded by ``max_concurrency``); completions mode sends one ``/completions``
request per group of prompts sharing a seed (ONE request for a batch without
per-request seeds). Each request carries its own ``GenerationRequest.seed``. 429,
408, 5xx, connection errors and timeouts are retried with exponential backoff and
jitter (honouring ``Retry-After``) and then raise for the round; another 4xx is that
request's own ``GenerationError`` (a ``ContextLengthError`` when the prompt is over
the context window); malformed bodies raise ``BackendError``.

``max_tokens`` is kept inside the model's context window per request (see
``OpenAIBackend``: clamped before sending where the prompt's length is known, else
retried once clamped when the server's 400 states it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import httpx

from .._resource import AsyncResource
from ..errors import BackendError, BackendTimeoutError, ClosedError, ContextLengthError
from ..types import ChatMessage, Completion, GenerationError, GenerationRequest, SamplingParams
from ._concurrency import gather_in_order
from ._openai_rl import ServerSwap
from ._openai_wire import (
    MalformedResponse,
    Prompt,
    chat_payload,
    completions_payload,
    parse_chat_response,
    parse_completions_response,
    render_plain_prompt,
)
from ._outcomes import check_context_length, context_overflow, request_error
from ._parsing import OutputParsers, ParsePlan, check_parser_names, forces_tool_call
from ._weights import (
    DEFAULT_UPDATE_TIMEOUT,
    UpdateMode,
    WeightSwitch,
    check_update,
    check_version,
    tag,
)

__all__ = ["OpenAIBackend", "render_plain_prompt"]

T = TypeVar("T")

_log = logging.getLogger(__name__)

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
    is not closed by ``aclose``. ``tokenizer`` (a tokenizer object, or a model directory
    or name loaded with ``transformers.AutoTokenizer``) is the served model's: with it, a
    completions-mode backend serves the runner's token mode.

    Reasoning and tools. Chat mode: the server parses (``vllm serve --reasoning-parser
    ... --enable-auto-tool-choice --tool-call-parser ...``); the message's ``reasoning``
    (or ``reasoning_content``) becomes ``Completion.reasoning``, its ``tool_calls``
    ``Completion.tool_calls``; a request's ``tool_choice`` is sent when set. Completions
    mode: the server returns raw text, so ``tool_call_parser``/``reasoning_parser`` (the
    same names; they need vLLM installed here and ``tokenizer``) parse it here with vLLM's
    own parsers, as ``VLLMBackend`` does; a forced ``tool_choice`` (``"required"`` or a
    named function) is that request's ``GenerationError`` there (the completions route
    takes no ``tool_choice``: use chat mode or ``VLLMBackend``). The parser arguments are
    refused in chat mode (the server's own flags apply there).

    Context window: ``context_length``, else the ``max_model_len`` of the model's entry in
    ``GET /models`` (vLLM reports it; fetched once, when first needed, and cached), else
    unknown. Completions mode with token-id prompts: the prompt's length is known, so each
    request's ``max_tokens`` is clamped to what it leaves of the window before sending,
    and a prompt that leaves no room (>= the window) is its ``GenerationError`` with a
    ``ContextLengthError``, never sent. Chat mode (and text prompts): the prompt's length
    is only known to the server. vLLM >= 0.10 clamps ``max_tokens`` to the window itself
    and rejects only a prompt over it; OpenAI, SGLang and older vLLM reject prompt +
    ``max_tokens`` over the window with a 400 that states the prompt's token count and
    the window: the request is then sent once more with ``max_tokens`` = what is left (a
    prompt that leaves nothing is a ``ContextLengthError``). That costs a round trip only
    on the rare overflow, where asking ``/tokenize`` first (vLLM only) would cost one on
    every request and template every conversation twice.
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
        tokenizer: Any = None,
        policy_version: int | None = 0,
        handoff_dir: str | os.PathLike[str] | None = None,
        update_timeout: float = DEFAULT_UPDATE_TIMEOUT,
        context_length: int | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_version(policy_version, owner="OpenAIBackend")
        if mode not in ("chat", "completions"):
            raise ValueError(f"OpenAIBackend mode must be 'chat' or 'completions', got {mode!r}")
        check_context_length(context_length, owner="OpenAIBackend")
        if tool_call_parser is not None or reasoning_parser is not None:
            if mode != "completions":
                raise ValueError(
                    "OpenAIBackend tool_call_parser/reasoning_parser parse completions-mode "
                    "text here; in chat mode the server parses (vllm serve --tool-call-parser "
                    "/ --reasoning-parser)"
                )
            if tokenizer is None:
                raise ValueError(
                    "OpenAIBackend tool_call_parser/reasoning_parser need tokenizer= (the "
                    "served model's tokenizer, or its model directory)"
                )
            check_parser_names(tool_call_parser, reasoning_parser, "auto", owner="OpenAIBackend")
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
        self._tokenizer = tokenizer
        self._tokenizer_lock = asyncio.Lock()
        self._weights = WeightSwitch(
            policy_version, handoff_dir, update_timeout, owner="OpenAIBackend"
        )
        self._context_length = context_length
        self._context_known = context_length is not None
        self._context_lock = asyncio.Lock()
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        self._chat_template_kwargs = dict(chat_template_kwargs or {})
        self._parsers: OutputParsers | None = None
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, mode={self.mode!r})"
        )

    @property
    def policy_version(self) -> int | None:
        """The served weights' version: each completion is tagged with it when its
        response arrives (the OpenAI routes report no per-token spans)."""
        return self._weights.version

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, Any]], *, version: int, mode: UpdateMode = "keep"
    ) -> None:
        """Load ``named_tensors`` into a vLLM server and make ``version`` current, through
        its RL and dev endpoints (the server needs ``VLLM_SERVER_DEV_MODE=1``).

        ``POST /pause?mode=...``, ``/collective_rpc`` ``reload_weights(weights_path=DIR)``
        (a safetensors file the server must be able to read: same host, or ``handoff_dir``
        on a shared filesystem), ``/reset_prefix_cache?reset_running_requests=true``,
        ``/update_weight_version``, then ``/resume`` (always). Modes as in
        ``VLLMBackend.update_weights``; requests the server aborted are sent again.
        ``update_timeout`` bounds the swap (and then the resume) as there.
        """
        check_update(mode, version, owner="OpenAIBackend")
        if self._closed:
            raise ClosedError("OpenAIBackend")
        target = ServerSwap(self._client, self.base_url, self._headers)
        await self._weights.switch(named_tensors, version, mode, target)

    async def get_context_length(self) -> int | None:
        """The model's context window: ``context_length``, else the ``max_model_len`` of
        the model's entry in ``GET /models`` (asked once, cached), else None. A server that
        cannot be reached is asked again next time; one that answers without the field
        (or with an error status) is not."""
        if self._context_known:
            return self._context_length
        async with self._context_lock:
            if not self._context_known:
                self._context_length = await self._fetch_context_length()
        return self._context_length

    async def _fetch_context_length(self) -> int | None:
        url = f"{self.base_url}/models"
        try:
            response = await self._client.get(url, headers=self._headers, timeout=self._timeout)
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
            if isinstance(entry, Mapping) and entry.get("id") == self.model:
                value = entry.get("max_model_len")
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        """One result per request, in request order; a request the server rejects on its
        own (4xx) gets a ``GenerationError`` at its position."""
        if self._closed:
            raise ClosedError("OpenAIBackend")
        if not requests:
            return []
        if self.mode == "chat":
            return await gather_in_order(self._chat(i, r, params) for i, r in enumerate(requests))
        return await self._completions(requests, params)

    async def _chat(
        self, index: int, request: GenerationRequest, params: SamplingParams
    ) -> Completion | GenerationError:
        url = f"{self.base_url}/chat/completions"
        payload = chat_payload(
            self.model, request, params, vllm_extras=self.vllm_extras, extra_body=self.extra_body
        )

        async def send() -> Completion | GenerationError:
            try:
                response = await self._post_within_window(url, payload)
            except BackendError as exc:
                return _rejected(exc, index, request)
            return tag(_parse(response, parse_chat_response), self._weights.version)

        return await self._weights.complete_one(send)

    async def _post_within_window(self, url: str, payload: Mapping[str, Any]) -> httpx.Response:
        """POST one prompt; when the server rejects it because prompt + ``max_tokens`` is over
        the window and its message states the prompt's length (OpenAI, SGLang, vLLM < 0.10),
        send it once more with ``max_tokens`` = what the prompt leaves."""
        try:
            return await self._post(url, payload)
        except ContextLengthError as exc:
            overflow = context_overflow(f"{exc.message}\n{exc.body or ''}")
            room = overflow.room() if overflow is not None else None
            sent = payload.get("max_tokens")
            if room is None or room < 1 or not isinstance(sent, int) or room >= sent:
                raise
            _log.debug(
                "%s: prompt + max_tokens over the window; max_tokens %d -> %d", url, sent, room
            )
            return await self._post(url, {**payload, "max_tokens": room})

    async def _completions(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        """One request per group of prompts that share a kind (token ids or text), a seed and
        what the window and the parsers set (``max_tokens``, ``skip_special_tokens``): a batch
        without seeds is ONE request, per-request seeds need one request each. Token-id
        prompts that leave no room in the window are never sent."""
        prompts: list[Prompt] = [
            list(r.prompt_token_ids)
            if r.prompt_token_ids is not None
            else self._prompt_renderer(r.messages)
            for r in requests
        ]
        parsers = await self._output_parsers()
        window = (
            await self.get_context_length() if any(isinstance(p, list) for p in prompts) else None
        )
        results: dict[int, Completion | GenerationError] = {}
        plans: dict[int, ParsePlan] = {}
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, (prompt, request) in enumerate(zip(prompts, requests, strict=True)):
            try:
                max_tokens = params.max_tokens
                if isinstance(prompt, list) and window is not None:
                    max_tokens = _room(len(prompt), window, max_tokens)
                extra: tuple[tuple[str, Any], ...] = ()
                if forces_tool_call(request.tool_choice):
                    raise BackendError(
                        f"tool_choice={request.tool_choice!r}: the completions route takes no "
                        "tool_choice (use mode='chat', or VLLMBackend)"
                    )
                if parsers is not None:
                    ids = prompt if isinstance(prompt, list) else []
                    plan = parsers.plan(request, ids)
                    plans[i] = plan
                    if self.vllm_extras and "skip_special_tokens" in plan.sampling:
                        extra = (("skip_special_tokens", plan.sampling["skip_special_tokens"]),)
            except BackendError as exc:
                results[i] = _own_error(exc, i, request)
                continue
            key = (isinstance(prompt, list), request.seed, max_tokens, extra)
            groups.setdefault(key, []).append(i)
        parts = await gather_in_order(
            self._completions_group(
                idx,
                [prompts[i] for i in idx],
                requests,
                seed,
                dataclasses.replace(params, max_tokens=max_tokens),
                dict(extra),
            )
            for (_, seed, max_tokens, extra), idx in groups.items()
        )
        for idx, outcomes in zip(groups.values(), parts, strict=True):
            results.update(zip(idx, outcomes, strict=True))
        return [
            self._parsed(i, results[i], plans.get(i), requests[i]) for i in range(len(requests))
        ]

    def _parsed(
        self,
        index: int,
        outcome: Completion | GenerationError,
        plan: ParsePlan | None,
        request: GenerationRequest,
    ) -> Completion | GenerationError:
        """``outcome`` split by the local parsers (completions mode)."""
        if plan is None or not isinstance(outcome, Completion):
            return outcome
        try:
            return plan.apply(outcome)
        except Exception as exc:
            error = BackendError(
                f"vLLM's parsers failed on the output: {type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            return _own_error(error, index, request)

    async def _output_parsers(self) -> OutputParsers | None:
        """The local parsers (completions mode), built once for the tokenizer."""
        if self._tool_call_parser is None and self._reasoning_parser is None:
            return None
        if self._parsers is None:
            tokenizer = await self.get_tokenizer()
            if self._parsers is None:
                self._parsers = OutputParsers(
                    tokenizer,
                    tool_call_parser=self._tool_call_parser,
                    reasoning_parser=self._reasoning_parser,
                    chat_template_kwargs=self._chat_template_kwargs,
                    # Forced calls are refused here: no grammar to wait for.
                    grammar_waits_for_reasoning=True,
                )
        return self._parsers

    async def _completions_group(
        self,
        indices: Sequence[int],
        prompts: Sequence[Prompt],
        requests: Sequence[GenerationRequest],
        seed: int | None,
        params: SamplingParams,
        extra: Mapping[str, Any],
    ) -> list[Completion | GenerationError]:
        """POST one list of prompts; if the server rejects the list (4xx), send each prompt
        alone so only the prompts at fault fail (a prompt alone whose ``max_tokens`` is over
        the window is retried clamped). Prompts stopped by an abort-mode update are sent
        again (only those)."""
        url = f"{self.base_url}/completions"

        async def send(ks: Sequence[int]) -> list[Completion | GenerationError]:
            payload = completions_payload(
                self.model,
                [prompts[k] for k in ks],
                params,
                seed=seed,
                vllm_extras=self.vllm_extras,
                extra_body={**extra, **self.extra_body},
            )
            try:
                if len(ks) == 1:
                    response = await self._post_within_window(url, payload)
                else:
                    response = await self._post(url, payload)
            except BackendError as exc:
                if len(ks) == 1:
                    return [_rejected(exc, indices[ks[0]], requests[indices[ks[0]]])]
                if not _is_rejection(exc):
                    raise
                alone = await gather_in_order(
                    self._completions_group(
                        [indices[k]], [prompts[k]], requests, seed, params, extra
                    )
                    for k in ks
                )
                return [outcome for [outcome] in alone]
            parsed = _parse(response, lambda data: parse_completions_response(data, len(ks)))
            return [tag(c, self._weights.version) for c in parsed]

        return await self._weights.complete(send, len(prompts))

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
                    raise request_error(
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

    def token_mode_error(self) -> str | None:
        """Why this backend cannot serve token mode (None when it can)."""
        if self.mode != "completions":
            return (
                f"OpenAIBackend in mode={self.mode!r} lets the server template the messages: "
                "token mode needs mode='completions'"
            )
        if self._tokenizer is None:
            return (
                "OpenAIBackend has no tokenizer: pass tokenizer= (the served model's "
                "tokenizer, or its model directory) for token mode"
            )
        return None

    async def get_tokenizer(self) -> Any:
        """The served model's tokenizer (a directory or name is loaded once, off the loop)."""
        problem = self.token_mode_error()
        if problem is not None:
            raise BackendError(problem)
        async with self._tokenizer_lock:
            if isinstance(self._tokenizer, str | os.PathLike):
                self._tokenizer = await asyncio.to_thread(_load_tokenizer, self._tokenizer)
        return self._tokenizer

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


def _load_tokenizer(source: str | os.PathLike[str]) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise BackendError(
            f"OpenAIBackend(tokenizer={str(source)!r}) needs transformers to load it "
            f"(pip install transformers), or pass a tokenizer object: {exc}"
        ) from exc
    try:
        return AutoTokenizer.from_pretrained(os.fspath(source))
    except Exception as exc:
        raise BackendError(
            f"OpenAIBackend could not load the tokenizer {str(source)!r}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _is_rejection(exc: BackendError) -> bool:
    """A non-retryable 4xx: the server refused this request's content, not the round."""
    status = exc.status_code
    return status is not None and 400 <= status < 500 and status not in _RETRYABLE_STATUS


def _room(prompt_length: int, window: int, max_tokens: int) -> int:
    """``max_tokens`` clamped to what a prompt of ``prompt_length`` tokens leaves of the
    window; a ``ContextLengthError`` when it leaves nothing."""
    if prompt_length >= window:
        raise ContextLengthError(
            f"the prompt is {prompt_length} tokens and the model's maximum context length is "
            f"{window} tokens: no room for a completion (not sent)"
        )
    return min(max_tokens, window - prompt_length)


def _own_error(exc: BackendError, index: int, request: GenerationRequest) -> GenerationError:
    """A failure of one request (found before sending, or a rejection), as the request's
    own outcome naming it."""
    error = type(exc)(
        f"request {index} of the round (rollout {request.rollout_index}, step {request.step}): "
        f"{exc.message}",
        status_code=exc.status_code,
        url=exc.url,
        body=exc.body,
    )
    error.__cause__ = exc.__cause__ or exc
    return GenerationError(error=error, request_index=index)


def _rejected(exc: BackendError, index: int, request: GenerationRequest) -> GenerationError:
    """A rejection as the request's own outcome (naming it); anything else fails the round."""
    if not _is_rejection(exc):
        raise exc
    return _own_error(exc, index, request)


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
