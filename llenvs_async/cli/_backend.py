"""Backend flags shared by ``run`` and ``q-values``: scripted oracle, OpenAI-compatible, vLLM."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast
from urllib.parse import urlsplit

from .._shield import shielded
from ..backends.base import Backend
from ..backends.scripted import ScriptedBackend
from ..models import KNOWN_MODELS, resolve_model
from ..runner import Schedule, TrajectoryRunner
from ..types import SamplingParams
from ._common import CliError
from ._sources import Source

__all__ = ["BackendKind", "BackendOptions", "build_backend", "open_runner"]


class BackendKind(StrEnum):
    scripted = "scripted"
    openai = "openai"
    vllm = "vllm"


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendOptions:
    kind: BackendKind
    model: str | None
    base_url: str | None
    epsilon: float
    seed: int
    temperature: float
    max_tokens: int
    top_p: float = 1.0
    token_mode: bool = False
    tokenizer: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    keep_reasoning: bool = False
    tool_choice: str | None = None
    system_prompt: str | None = None  # the text of --system-prompt
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    def check(self) -> None:
        """Validate flag combinations before anything is started."""
        if not 0.0 <= self.epsilon <= 1.0:
            raise CliError(f"--epsilon must be in [0, 1], got {self.epsilon}")
        if self.kind is BackendKind.openai and not (self.model and self.base_url):
            raise CliError("--backend openai needs --model and --base-url")
        if self.kind is BackendKind.openai and self.base_url is not None:
            url = urlsplit(self.base_url)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise CliError(
                    f"--base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                    f"got {self.base_url!r}"
                )
        if self.kind is BackendKind.vllm and not self.model:
            raise CliError("--backend vllm needs --model")
        if self.token_mode and self.kind is BackendKind.scripted:
            raise CliError("--token-mode needs --backend vllm or openai (with --tokenizer)")
        if self.token_mode and self.kind is BackendKind.openai and not self.tokenizer:
            raise CliError("--backend openai --token-mode needs --tokenizer (a model directory)")
        if (
            self.tokenizer is not None
            and self.tokenizer not in KNOWN_MODELS
            and not os.path.isdir(self.tokenizer)
        ):
            raise CliError(f"--tokenizer {self.tokenizer!r} is not a directory")
        if self.temperature < 0 or self.max_tokens < 1:
            raise CliError("--temperature must be >= 0 and --max-tokens >= 1")
        if self.tool_choice not in (None, "auto", "required", "none"):
            raise CliError(
                f"--tool-choice must be auto, required or none, got {self.tool_choice!r}"
            )
        parsers = self.tool_call_parser is not None or self.reasoning_parser is not None
        local = self.kind is BackendKind.vllm or (
            self.kind is BackendKind.openai and self.token_mode
        )
        if parsers and not local:
            raise CliError(
                "--tool-call-parser and --reasoning-parser parse here (--backend vllm, or "
                "--backend openai --token-mode); in chat mode the server parses with its own "
                "`vllm serve` flags"
            )

    @property
    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
            seed=self.seed,
        )  # fmt: skip


def build_backend(options: BackendOptions, source: Source) -> Backend:
    """The backend the flags ask for; the scripted one is the source's epsilon-oracle."""
    if options.kind is BackendKind.scripted:
        return ScriptedBackend(source.oracle(options.epsilon, options.seed))
    assert options.model is not None
    if options.kind is BackendKind.openai:
        from ..backends.openai import OpenAIBackend

        assert options.base_url is not None
        return OpenAIBackend(
            options.base_url,
            options.model,
            api_key=os.environ.get("OPENAI_API_KEY"),
            mode="completions" if options.token_mode else "chat",
            tokenizer=options.tokenizer and resolve_model(options.tokenizer),
            # Chat mode: the server applies the template (token mode: the runner does).
            extra_body=_template_body(options),
            # Token mode parses the raw completion here; chat mode's server parses.
            tool_call_parser=options.tool_call_parser if options.token_mode else None,
            reasoning_parser=options.reasoning_parser if options.token_mode else None,
        )
    from ..backends.vllm import VLLMBackend

    # Without vLLM installed this raises BackendError naming the extra to install.
    return VLLMBackend(
        model=resolve_model(options.model),  # a known model's name: fetched once, cached
        tool_call_parser=options.tool_call_parser,
        reasoning_parser=options.reasoning_parser,
        chat_template_kwargs=options.chat_template_kwargs,
    )


def _template_body(options: BackendOptions) -> dict[str, Any] | None:
    kwargs = options.chat_template_kwargs
    if not kwargs or options.token_mode:
        return None
    return {"chat_template_kwargs": dict(kwargs)}


@contextlib.asynccontextmanager
async def open_runner(
    source: Source,
    options: BackendOptions,
    *,
    snapshot: bool = False,
    processes: bool = False,
    schedule: str = "refill",
) -> AsyncIterator[TrajectoryRunner]:
    """A runner over ``source`` with the flags' backend and ``--schedule``; runner and
    backend closed on exit.

    ``snapshot``: restore containers by snapshot-fork (``SnapshotRestore``) instead of replay;
    ``processes``: fork gVisor sandboxes from a checkpoint (``SnapshotRestore(processes=True)``).
    """
    restore_fn = source.restore_fn
    if snapshot:
        if restore_fn is None:
            raise CliError("--snapshot needs a container dataset (a Harbor task directory)")
        from ..adapters.harbor import SnapshotRestore

        restore_fn = SnapshotRestore(processes=processes)
    backend = build_backend(options, source)
    scripted = options.kind is BackendKind.scripted
    # A restored state carries its history: the default conversation is what the policy saw.
    runner = TrajectoryRunner(
        source.environment, backend, options.sampling_params,
        env_factory=source.env_factory, restore_fn=restore_fn,
        max_steps=source.spec.max_steps,
        system_prompt="" if scripted else (options.system_prompt or source.system_prompt),
        token_mode=options.token_mode, schedule=cast(Schedule, schedule),
        chat_template_kwargs=options.chat_template_kwargs if options.token_mode else None,
        tool_choice=options.tool_choice, keep_reasoning=options.keep_reasoning,
    )  # fmt: skip
    try:
        yield runner
    finally:
        try:
            await shielded(runner.aclose(), within=None)  # removes snapshot images
        finally:
            await shielded(backend.aclose(), within=None)
