"""Typer option declarations shared by several commands."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..adapters.harbor.settings import HarborSettings, HarborSettingsError
from ..models import KNOWN_MODELS
from ..shell_task import DEFAULT_MAX_OBSERVATION_CHARS
from ._backend import BackendKind, BackendOptions
from ._common import CliError

__all__ = [
    "ActionFormatOpt",
    "AllowNetworkOpt",
    "ChatTemplateKwargsOpt",
    "KeepReasoningOpt",
    "MaxFormatErrorsOpt",
    "ObservationCharsOpt",
    "ReasoningParserOpt",
    "SystemPromptOpt",
    "ToolCallParserOpt",
    "ToolChoiceOpt",
    "BackendOpt",
    "BaseImageOpt",
    "BuildCaBundleOpt",
    "BuildNetworkOpt",
    "CommandTimeoutOpt",
    "ProvisionIndexUrlOpt",
    "ProvisionVerifierOpt",
    "BaseUrlOpt",
    "DatasetArg",
    "EnvOpt",
    "EpsilonOpt",
    "MaxStepsOpt",
    "MaxTokensOpt",
    "ModelOpt",
    "NConcurrentOpt",
    "QuietOpt",
    "RayAddressOpt",
    "RuntimeOpt",
    "ScheduleKind",
    "ScheduleOpt",
    "TokenModeOpt",
    "TokenizerOpt",
    "SeedOpt",
    "TemperatureOpt",
    "DEFAULT_MAX_OBSERVATION_CHARS",
    "DEFAULT_MAX_TOKENS",
    "backend_options",
    "harbor_options",
]

DatasetArg = Annotated[
    str | None,
    typer.Argument(help="Harbor dataset: a task directory, a directory of tasks, or name@version."),
]
EnvOpt = Annotated[
    str | None, typer.Option("--env", help="Built-in environment: arithmetic, chain or counter.")
]
MaxStepsOpt = Annotated[int | None, typer.Option("--max-steps", help="Steps per rollout.")]
NConcurrentOpt = Annotated[
    int, typer.Option("--n-concurrent", "-c", help="Rollouts (and containers) alive at once.")
]
BackendOpt = Annotated[BackendKind, typer.Option("--backend", help="Who chooses the actions.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model name (openai, vllm).")]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"),
]
EpsilonOpt = Annotated[
    float,
    typer.Option("--epsilon", help="Scripted oracle: probability of a wrong/destructive action."),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the scripted policy and sampling.")]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        help="Sampling temperature (default: the known model's measured setting, else 1.0).",
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        help="Tokens per generated action, clamped to what the context window leaves "
        "(default: the known model's measured setting, else 4096: room for a reasoning "
        "model to think).",
    ),
]
DEFAULT_MAX_TOKENS = 4096
DEFAULT_TEMPERATURE = 1.0
ActionFormatOpt = Annotated[
    str,
    typer.Option(
        "--action-format",
        help="How replies become commands: text (one fenced block, or the submit word) or "
        "tools (native bash/submit tool calls).",
    ),
]
MaxFormatErrorsOpt = Annotated[
    int,
    typer.Option("--max-format-errors", help="Consecutive unparseable replies that end a rollout."),
]
ObservationCharsOpt = Annotated[
    int,
    typer.Option("--observation-chars", help="Characters of a command's output shown (head+tail)."),
]
SystemPromptOpt = Annotated[
    Path | None,
    typer.Option("--system-prompt", help="A file whose text replaces the format's system prompt."),
]
ChatTemplateKwargsOpt = Annotated[
    str | None,
    typer.Option(
        "--chat-template-kwargs",
        help="JSON object for the chat template, e.g. '{\"enable_thinking\": false}'.",
    ),
]
KeepReasoningOpt = Annotated[
    bool,
    typer.Option("--keep-reasoning", help="Chat mode: re-send earlier turns' reasoning."),
]
ToolChoiceOpt = Annotated[
    str | None,
    typer.Option("--tool-choice", help="With --action-format tools: auto, required or none."),
]
ToolCallParserOpt = Annotated[
    str | None,
    typer.Option("--tool-call-parser", help="--backend vllm: vLLM's tool parser, e.g. hermes."),
]
ReasoningParserOpt = Annotated[
    str | None,
    typer.Option("--reasoning-parser", help="--backend vllm: vLLM's reasoning parser, e.g. qwen3."),
]


class ScheduleKind(StrEnum):
    """The runner's schedules (``runner._lockstep.SCHEDULES``, in that order)."""

    refill = "refill"
    chunks = "chunks"
    async_ = "async"


ScheduleOpt = Annotated[
    ScheduleKind,
    typer.Option(
        "--schedule",
        help="refill: lockstep rounds, a freed slot takes the next rollout; chunks: the next "
        "-c rollouts start when all are done; async: no rounds, each rollout generates as "
        "soon as it stepped (ready requests share a call). Same samples under all three.",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No live progress display.")]
BaseImageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--base-image",
        help="Map images tasks name (FROM, COPY --from, docker_image) to a local image: "
        "PATTERN=IMAGE, e.g. 'python:3.*=llenvs/python:3-bookworm' (repeatable).",
    ),
]
BuildNetworkOpt = Annotated[
    bool,
    typer.Option(
        "--build-network", help="Build task images with the host's network (apt/pip in builds)."
    ),
]
BuildCaBundleOpt = Annotated[
    str | None,
    typer.Option("--build-ca-bundle", help="A host CA bundle file to trust inside builds."),
]
ProvisionVerifierOpt = Annotated[
    bool,
    typer.Option(
        "--provision-verifier",
        help="With --build-network: fetch what a 'curl .../uv/VER/install.sh | sh; uvx -w ... "
        "pytest' test.sh downloads at build time, so the verifier runs offline.",
    ),
]
ArtifactsDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--artifacts-dir",
        help="Keep each verified episode's artifacts (the task's 'artifacts', /logs/artifacts) "
        "under DIR/<task>/<episode>/.",
    ),
]
StartStepOpt = Annotated[
    str | None,
    typer.Option(
        "--start-step",
        help="Multi-step tasks: start every rollout at step NAME (earlier steps' oracle "
        "solutions are replayed first, as Harbor does).",
    ),
]
ProvisionIndexUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--provision-index-url",
        help="The package index (a PEP 503 /simple URL) --provision-verifier downloads from.",
    ),
]
AllowNetworkOpt = Annotated[
    bool,
    typer.Option("--allow-network", help="Give containers a network when their task allows one."),
]
CommandTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--command-timeout",
        help="Seconds per command (default: the task's \\[agent].timeout_sec, else 600).",
    ),
]
TokenModeOpt = Annotated[
    bool,
    typer.Option(
        "--token-mode",
        help="Keep each rollout's prompt as token ids (exact for RL; --backend vllm, or "
        "openai in completions mode with --tokenizer); `export` writes them for trainers.",
    ),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer", help="Tokenizer (a model directory) for --backend openai --token-mode."
    ),
]
RuntimeOpt = Annotated[
    str,
    typer.Option(
        "--runtime",
        help="Container runtime of Harbor tasks: runc (Docker) or gvisor (runsc sandboxes; "
        "with q-values --snapshot, forks keep processes and shell state).",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        envvar="RAY_ADDRESS",
        help="Run each instance in a Ray actor on this cluster (host:port); needs the "
        "\\[ray] extra (pip install 'llenvs-async\\[ray]').",
    ),
]


def backend_options(
    backend: BackendKind,
    model: str | None,
    base_url: str | None,
    epsilon: float,
    seed: int,
    temperature: float | None,
    max_tokens: int | None,
    token_mode: bool = False,
    tokenizer: str | None = None,
    *,
    chat_template_kwargs: str | None = None,
    keep_reasoning: bool = False,
    tool_choice: str | None = None,
    system_prompt: Path | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> BackendOptions:
    """Bundle and validate the backend flags; sampling flags left unset take the known
    model's measured defaults (``llenvs_async.models``), else the generic ones."""
    spec = KNOWN_MODELS.get(model or "")
    if temperature is None:
        temperature = spec.temperature if spec else DEFAULT_TEMPERATURE
    if max_tokens is None:
        max_tokens = spec.max_tokens if spec else DEFAULT_MAX_TOKENS
    options = BackendOptions(
        kind=backend, model=model, base_url=base_url, epsilon=epsilon, seed=seed,
        temperature=temperature, max_tokens=max_tokens, token_mode=token_mode,
        top_p=spec.top_p if spec else 1.0,
        tokenizer=tokenizer, chat_template_kwargs=_json_object(chat_template_kwargs),
        keep_reasoning=keep_reasoning, tool_choice=tool_choice,
        system_prompt=_read_prompt(system_prompt), tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning_parser,
    )  # fmt: skip
    options.check()
    return options


def _json_object(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--chat-template-kwargs: not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise CliError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    return value


def _read_prompt(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.expanduser().read_text()
    except OSError as exc:
        raise CliError(f"--system-prompt {str(path)!r}: {exc.strerror or exc}") from None


# The flag that sets each Harbor setting (how a settings error is worded here).
HARBOR_FLAGS = {
    "allow_network": "--allow-network", "base_image_aliases": "--base-image",
    "build_network": "--build-network", "build_ca_bundle": "--build-ca-bundle",
    "provision_verifier": "--provision-verifier", "provision_index_url": "--provision-index-url",
    "runtime": "--runtime", "artifacts_dir": "--artifacts-dir", "start_step": "--start-step",
    "action_format": "--action-format", "max_format_errors": "--max-format-errors",
    "max_observation_chars": "--observation-chars", "command_timeout_sec": "--command-timeout",
}  # fmt: skip


def check_choice(flag: str, value: str, choices: Iterable[str]) -> str:
    """``value`` when it is one of ``choices`` (read from a registry), else ``CliError``."""
    names = tuple(choices)
    if value not in names:
        raise CliError(f"{flag} must be one of {', '.join(names)}, got {value!r}")
    return value


def harbor_settings(base: HarborSettings | None = None, **values: Any) -> HarborSettings:
    """``HarborSettings(**values)`` (``base`` with ``values`` changed), a broken rule worded
    with the flags (``CliError``)."""
    try:
        return HarborSettings(**values) if base is None else dataclasses.replace(base, **values)
    except HarborSettingsError as exc:
        raise CliError(exc.wording(HARBOR_FLAGS)) from None


def harbor_options(
    base_images: list[str] | None,
    build_network: bool,
    build_ca_bundle: str | None,
    allow_network: bool,
    command_timeout: float | None,
    provision_verifier: bool = False,
    runtime: str = "runc",
    artifacts_dir: Path | None = None,
    start_step: str | None = None,
    provision_index_url: str | None = None,
    *,
    action_format: str = "text",
    max_format_errors: int = 3,
    observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
) -> HarborSettings:
    """The Harbor flags as one ``HarborSettings`` (its rules checked there)."""
    from ..adapters.harbor.images.image import parse_alias

    pairs = []
    for text in base_images or []:
        try:
            pairs.append(parse_alias(text))
        except ValueError as exc:
            raise CliError(f"--base-image: {exc}") from None
    timeout: dict[str, Any] = (
        {} if command_timeout is None else {"command_timeout_sec": command_timeout}
    )
    return harbor_settings(
        base_image_aliases=tuple(pairs), build_network=build_network,
        build_ca_bundle=build_ca_bundle, allow_network=allow_network,
        provision_verifier=provision_verifier, runtime=runtime,
        artifacts_dir=None if artifacts_dir is None else str(artifacts_dir),
        start_step=start_step, provision_index_url=provision_index_url,
        action_format=action_format, max_format_errors=max_format_errors,
        max_observation_chars=observation_chars, **timeout,
    )  # fmt: skip
