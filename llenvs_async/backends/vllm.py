"""In-process vLLM backend: ``vllm.v1.engine.async_llm.AsyncLLM`` (vLLM >= 0.11, extra ``[vllm]``).

vLLM is imported lazily (see ``_vllm_compat``), so this module imports without it.
One ``generate`` call submits every request of the round at once (one coroutine
per request in a task group) so the engine's scheduler batches them, each with its
own ``seed``. A request the engine rejects comes back as a ``GenerationError`` at
its position; if the call is cancelled, every request still in flight is aborted.
With ``tool_call_parser``/``reasoning_parser`` (``vllm serve``'s names) the output is
split with vLLM's own parsers as the server's chat route splits it (see ``_parsing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .._resource import AsyncResource
from .._shield import shielded
from ..errors import BackendError, ClosedError
from ..types import Completion, GenerationError, GenerationRequest, SamplingParams
from ._concurrency import gather_in_order
from ._outcomes import check_context_length, request_error
from ._parsing import OutputParsers, ParsePlan, check_parser_names, forces_tool_call
from ._vllm_compat import (
    build_engine,
    engine_context_length,
    engine_reasoning_parser,
    is_engine_dead,
    make_sampling_params,
    to_completion,
    tokens_prompt_factory,
)
from ._vllm_engine import EngineLike, EngineSwap, check_updatable
from ._vllm_prompts import describe, room, templated_ids
from ._weights import DEFAULT_UPDATE_TIMEOUT, UpdateMode, WeightSwitch, check_update, check_version

__all__ = ["EngineLike", "VLLMBackend"]

_log = logging.getLogger(__name__)


class VLLMBackend(AsyncResource):
    """A ``Backend`` on an in-process ``AsyncLLM``.

    Pass a ready ``engine`` (it stays yours: ``aclose`` does not shut it down) or
    ``model=`` plus engine args (``VLLMBackend.from_engine_args``): we build the
    engine and shut it down in ``aclose``. Requests with ``prompt_token_ids`` are
    sent as token prompts; others are chat-templated with the engine's tokenizer
    (or ``tokenizer``; ``chat_template_kwargs`` such as ``{"enable_thinking": False}``
    go to the template) on the event loop and sent as token ids, so the prompt ids
    come back exactly. ``abort_timeout`` bounds each abort on cancellation, ``update_timeout``
    each weight swap (``update_weights``).

    Parsing (both chat and token mode): ``tool_call_parser`` and ``reasoning_parser`` take
    the names ``vllm serve --tool-call-parser/--reasoning-parser`` take (``"hermes"``,
    ``"qwen3"``...; an unknown name is a ``ValueError`` listing vLLM's) and parse with
    vLLM's own parser classes as the server's chat route does: the reasoning goes to
    ``Completion.reasoning`` (and out of ``text``), tool calls to ``Completion.tool_calls``
    (``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``),
    ``text`` is the content left. Token ids and logprobs stay exactly the engine's.
    ``tool_call_parser`` is ``--enable-auto-tool-choice --tool-call-parser``: tool calls
    are parsed for ``tool_choice`` None/``"auto"``; ``"required"`` or a named function
    forces a call with the structured-output grammar vLLM's parser builds from the tool
    schemas (as the server does; ``tool_strict_level`` is ``--tool-strict-level``: with
    ``"auto"``, vLLM's default, the grammar forces the call and the function name but
    leaves a tool's arguments free unless the tool says ``"strict": true``;
    ``"parameter"`` pins every tool's arguments to its schema). A forced ``tool_choice``
    without ``tool_call_parser`` is that request's ``GenerationError``. An engine built
    here gets ``reasoning_parser`` as its engine arg too, so, as on the server, a forced
    call's grammar waits until the reasoning ends; on a ready engine without one the
    grammar binds from the first token (no reasoning is then parsed).

    Context window: ``context_length`` (default: the engine's ``max_model_len``). Each
    request's ``max_tokens`` is clamped to what its prompt leaves of the window (the
    prompt ids are always known here: the request's own, or the templated chat's); a
    prompt that leaves no room (>= the window) is that request's ``GenerationError``
    with a ``ContextLengthError``, without calling the engine.
    """

    def __init__(
        self,
        engine: EngineLike | None = None,
        *,
        model: str | None = None,
        tokenizer: Any = None,
        abort_timeout: float = 10.0,
        policy_version: int | None = 0,
        handoff_dir: str | os.PathLike[str] | None = None,
        update_timeout: float = DEFAULT_UPDATE_TIMEOUT,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        tool_strict_level: str = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        context_length: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        check_version(policy_version, owner="VLLMBackend")
        check_context_length(context_length, owner="VLLMBackend")
        check_parser_names(
            tool_call_parser, reasoning_parser, tool_strict_level, owner="VLLMBackend"
        )
        if (engine is None) == (model is None):
            raise ValueError("VLLMBackend needs exactly one of engine= or model=")
        if engine is not None and engine_kwargs:
            raise ValueError(
                f"VLLMBackend engine args {sorted(engine_kwargs)} need model=, not a ready engine"
            )
        if abort_timeout <= 0:
            raise ValueError(f"VLLMBackend abort_timeout must be > 0, got {abort_timeout!r}")
        if engine is None and reasoning_parser is not None:
            # As `vllm serve --reasoning-parser`: a forced call's grammar waits for the reasoning.
            engine_kwargs = {"reasoning_parser": reasoning_parser, **engine_kwargs}
        self._owns_engine = engine is None
        # the engine; None once one we built is shut down: the reference goes with it
        self._held: EngineLike | None = (
            engine if engine is not None else build_engine(str(model), engine_kwargs)
        )
        self._tokenizer = tokenizer
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        self._tool_strict_level = tool_strict_level
        self._chat_template_kwargs: Mapping[str, Any] = MappingProxyType(
            dict(chat_template_kwargs or {})
        )
        self._context_length = (
            context_length if context_length is not None else engine_context_length(self._engine)
        )
        self._parsers: OutputParsers | None = None
        self._abort_timeout = abort_timeout
        self._weights = WeightSwitch(
            policy_version, handoff_dir, update_timeout, owner="VLLMBackend"
        )
        self._closed = False

    @classmethod
    def from_engine_args(
        cls,
        model: str,
        *,
        tokenizer: Any = None,
        abort_timeout: float = 10.0,
        policy_version: int | None = 0,
        handoff_dir: str | os.PathLike[str] | None = None,
        update_timeout: float = DEFAULT_UPDATE_TIMEOUT,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        tool_strict_level: str = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        context_length: int | None = None,
        **engine_kwargs: Any,
    ) -> VLLMBackend:
        """Build and own an ``AsyncLLM`` from ``AsyncEngineArgs(model=model, **engine_kwargs)``
        (plus ``reasoning_parser``, when given); the other arguments are the constructor's."""
        return cls(
            model=model,
            tokenizer=tokenizer,
            abort_timeout=abort_timeout,
            policy_version=policy_version,
            handoff_dir=handoff_dir,
            update_timeout=update_timeout,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            tool_strict_level=tool_strict_level,
            chat_template_kwargs=chat_template_kwargs,
            context_length=context_length,
            **engine_kwargs,
        )

    @property
    def engine(self) -> EngineLike:
        """The vLLM engine (``ClosedError`` once an engine this backend built is closed)."""
        return self._engine

    @property
    def _engine(self) -> EngineLike:
        """The engine; ``ClosedError`` once the one we built is shut down and released
        (vLLM's ``AsyncLLM.__del__`` shuts it down again, which fails at interpreter exit)."""
        if self._held is None:
            raise ClosedError("VLLMBackend")
        return self._held

    @property
    def policy_version(self) -> int | None:
        """The weights' version: completions finishing now are tagged with it."""
        return self._weights.version

    @property
    def context_length(self) -> int | None:
        """The context window requests are clamped to (None: unknown, nothing clamped)."""
        return self._context_length

    async def get_context_length(self) -> int | None:
        """``context_length`` (the same call as ``OpenAIBackend.get_context_length``)."""
        return self._context_length

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        """Submit all requests concurrently; results come back in request order.

        A request the engine rejects on its own (prompt over the context window, a token
        id out of vocabulary, a chat template that fails, a ``tool_choice`` it cannot
        force) gets a ``GenerationError`` at its position; a dead engine, bad ``params``
        (shared by all) or parsers vLLM cannot build for the tokenizer raise for the round.
        """
        if self._closed:
            raise ClosedError("VLLMBackend")
        if not requests:
            return []
        # Built once so bad params fail the round here; per-request copies carry the seeds.
        make_sampling_params(params)
        if self._tool_call_parser is not None or self._reasoning_parser is not None:
            await self._output_parsers()
        wrap = tokens_prompt_factory()
        return await gather_in_order(
            self._run_one(i, r, params, wrap) for i, r in enumerate(requests)
        )

    async def _prompt_token_ids(self, index: int, request: GenerationRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        tokenizer = await self.get_tokenizer()
        return templated_ids(tokenizer, index, request, self._chat_template_kwargs)

    async def _output_parsers(self) -> OutputParsers:
        """The parsers for the engine's tokenizer, built once (a failure fails the round)."""
        if self._parsers is None:
            tokenizer = await self.get_tokenizer()
            if self._parsers is None:
                self._parsers = OutputParsers(
                    tokenizer,
                    tool_call_parser=self._tool_call_parser,
                    reasoning_parser=self._reasoning_parser,
                    tool_strict_level=self._tool_strict_level,
                    chat_template_kwargs=self._chat_template_kwargs,
                    grammar_waits_for_reasoning=engine_reasoning_parser(self._engine) is not None,
                )
        return self._parsers

    def _plan(
        self, index: int, request: GenerationRequest, prompt_ids: Sequence[int]
    ) -> ParsePlan | None:
        """How this request's output is parsed (None: it is not)."""
        if forces_tool_call(request.tool_choice) and self._tool_call_parser is None:
            raise BackendError(
                f"{describe(index, request)}: tool_choice={request.tool_choice!r} needs "
                "VLLMBackend(tool_call_parser=...) (vllm serve's --tool-call-parser name) "
                "to force and parse a call"
            )
        if self._parsers is None:
            return None
        try:
            return self._parsers.plan(request, prompt_ids)
        except BackendError as exc:
            raise BackendError(f"{describe(index, request)}: {exc.message}") from exc

    def token_mode_error(self) -> str | None:
        """Token mode always works here: token prompts go to the engine as they are."""
        return None

    async def get_tokenizer(self) -> Any:
        """The engine's tokenizer (or ``tokenizer``); the engine's ``get_tokenizer()`` is
        async in vLLM 0.11, sync later."""
        if self._tokenizer is None:
            tokenizer = self._engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):
                tokenizer = await tokenizer
            self._tokenizer = tokenizer
        return self._tokenizer

    async def _run_one(
        self,
        index: int,
        request: GenerationRequest,
        params: SamplingParams,
        wrap: Callable[[list[int]], Any],
    ) -> Completion | GenerationError:
        """Drain one request's output stream to its final output; abort it if we stop early.
        Then split it with the parsers, if any."""
        try:
            prompt_ids = await self._prompt_token_ids(index, request)
            max_tokens = room(self._context_length, index, request, prompt_ids, params.max_tokens)
            plan = self._plan(index, request, prompt_ids)
            sampling_params = make_sampling_params(
                params,
                request.seed,
                max_tokens=max_tokens,
                extra=plan.sampling if plan is not None else None,
            )
        except BackendError as exc:
            return GenerationError(error=exc, request_index=index)
        prompt = wrap(prompt_ids)
        # Stopped by update_weights(mode="abort"): sent again under the new weights.
        outcome = await self._weights.complete_one(
            lambda: self._submit(
                index, request, prompt, sampling_params, f"llenvs-{uuid.uuid4().hex}"
            )
        )
        if plan is None or not isinstance(outcome, Completion):
            return outcome
        try:
            return plan.apply(outcome)
        except Exception as exc:
            error = BackendError(
                f"{describe(index, request)}: vLLM's parsers failed on the output: "
                f"{type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            return GenerationError(error=error, request_index=index)

    async def _submit(
        self,
        index: int,
        request: GenerationRequest,
        prompt: Any,
        sampling_params: Any,
        request_id: str,
    ) -> Completion | GenerationError:
        """One attempt: drain the request's stream to its final output."""
        final: Any = None
        try:
            stream = self._engine.generate(prompt, sampling_params, request_id)
            async with contextlib.aclosing(stream):
                async for output in stream:
                    final = output
        except asyncio.CancelledError:
            await self._abort(request_id)
            raise
        except Exception as exc:
            await self._abort(request_id)
            message = (
                f"vLLM request {request_id} ({describe(index, request)}) failed: "
                f"{type(exc).__name__}: {exc}"
            )
            if is_engine_dead(exc):
                raise BackendError(message) from exc
            error = request_error(message)
            error.__cause__ = exc
            return GenerationError(error=error, request_index=index)
        if final is None:
            raise BackendError(f"vLLM request {request_id} produced no output")
        return to_completion(
            final, request_id, version=self._weights.version, initial_version=self._weights.initial
        )

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, Any]], *, version: int, mode: UpdateMode = "keep"
    ) -> None:
        """Load ``named_tensors`` (HF checkpoint names, e.g. a transformers model's
        ``named_parameters()``: pass every weight) into the engine and make ``version`` current.

        The engine is paused with ``pause_generation(mode=mode)``: ``keep`` freezes requests
        in flight, which then continue under the new weights (their completions get both
        versions in ``version_spans``); ``wait`` lets them finish under the old weights
        first; ``abort`` stops them, and ``generate`` resubmits them (same prompt and seed)
        once the new weights are in, so every call still returns every completion. New
        requests queue during the update. After loading, the prefix cache is reset and
        running requests are preempted, so no KV computed by the old weights is reused
        (a kept request recomputes its prefix under the new weights).

        Route (CPU and GPU alike): the tensors are written to a safetensors file in a fresh
        directory (``handoff_dir``, default ``/dev/shm``) and the worker's stock
        ``reload_weights(weights_path=...)`` loads them with the model's ``load_weights``.
        ``collective_rpc`` cannot carry tensors to the worker process itself (vLLM's msgpack
        only rebuilds tensors in typed fields), and the shipped IPC/NCCL transfer engines
        need CUDA. Once the engine is paused the swap runs to its end even if the caller
        is cancelled, bounded by ``update_timeout`` (then the resume by as much again: a
        ``BackendError`` says whether the engine could be resumed); a failed load resumes
        the engine on the old version and raises.
        """
        check_update(mode, version, owner="VLLMBackend")
        if self._closed:
            raise ClosedError("VLLMBackend")
        check_updatable(self._engine)
        await self._weights.switch(named_tensors, version, mode, EngineSwap(self._engine))

    async def _abort(self, request_id: str) -> None:
        """Abort in the engine, shielded from cancellation and bounded by ``abort_timeout``
        (nothing to abort in an engine we already shut down)."""
        if self._held is None:
            return
        try:
            await shielded(self._engine.abort(request_id), within=self._abort_timeout)
        except Exception as exc:  # the request is being abandoned anyway: log, do not mask
            _log.warning("could not abort vLLM request %s: %r", request_id, exc)

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Shut the engine down if we built it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_engine:
            engine, self._held = self._engine, None
            engine.shutdown()
