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
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

import httpx

from .._resource import AsyncResource
from ..errors import BackendError, ClosedError
from ..types import ChatMessage, Completion, GenerationError, GenerationRequest, SamplingParams
from ._concurrency import gather_in_order
from ._openai_http import ServerClient, api_root, is_rejection, parse_body
from ._openai_requests import group_prompts, parsed, rejected
from ._openai_rl import ServerSwap
from ._openai_wire import (
    Prompt,
    chat_payload,
    completions_payload,
    parse_chat_response,
    parse_completions_response,
    render_plain_prompt,
)
from ._outcomes import check_context_length
from ._parsing import OutputParsers, check_parser_names
from ._weights import (
    DEFAULT_UPDATE_TIMEOUT,
    UpdateMode,
    WeightSwitch,
    check_update,
    check_version,
    tag,
)

__all__ = ["OpenAIBackend", "render_plain_prompt"]

_log = logging.getLogger(__name__)


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
        self.base_url = api_root(base_url)
        self.model = model
        self.mode = mode
        self.vllm_extras = vllm_extras
        self.extra_body: Mapping[str, Any] = MappingProxyType(dict(extra_body or {}))
        self._prompt_renderer = prompt_renderer
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._http = ServerClient(
            client,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_concurrency=max_concurrency,
            context_length=context_length,
        )
        self._tokenizer = tokenizer
        self._tokenizer_lock = asyncio.Lock()
        self._weights = WeightSwitch(
            policy_version, handoff_dir, update_timeout, owner="OpenAIBackend"
        )
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
    def max_retries(self) -> int:
        return self._http.max_retries

    @property
    def backoff(self) -> float:
        return self._http.backoff

    @property
    def max_backoff(self) -> float:
        return self._http.max_backoff

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
        target = ServerSwap(self._http.client, self.base_url, self._http.headers)
        await self._weights.switch(named_tensors, version, mode, target)

    async def get_context_length(self) -> int | None:
        """The model's context window: ``context_length``, else the ``max_model_len`` of
        the model's entry in ``GET /models`` (asked once, cached), else None. A server that
        cannot be reached is asked again next time; one that answers without the field
        (or with an error status) is not."""
        return await self._http.context_length(self.base_url, self.model)

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
                response = await self._http.post_within_window(url, payload)
            except BackendError as exc:
                return rejected(exc, index, request)
            return tag(parse_body(response, parse_chat_response), self._weights.version)

        return await self._weights.complete_one(send)

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
        results, plans, groups = group_prompts(
            prompts, requests, params, window, parsers, vllm_extras=self.vllm_extras
        )
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
        return [parsed(i, results[i], plans.get(i), requests[i]) for i in range(len(requests))]

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
                    response = await self._http.post_within_window(url, payload)
                else:
                    response = await self._http.post(url, payload)
            except BackendError as exc:
                if len(ks) == 1:
                    return [rejected(exc, indices[ks[0]], requests[indices[ks[0]]])]
                if not is_rejection(exc):
                    raise
                alone = await gather_in_order(
                    self._completions_group(
                        [indices[k]], [prompts[k]], requests, seed, params, extra
                    )
                    for k in ks
                )
                return [outcome for [outcome] in alone]
            outcomes = parse_body(response, lambda data: parse_completions_response(data, len(ks)))
            return [tag(c, self._weights.version) for c in outcomes]

        return await self._weights.complete(send, len(prompts))

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
        await self._http.aclose()


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
