"""Typer option declarations shared by several commands."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ._backend import BackendKind, BackendOptions
from ._common import CliError
from ._source_types import HarborOptions

__all__ = [
    "AllowNetworkOpt",
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
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Tokens per generated action.")]


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
    temperature: float,
    max_tokens: int,
    token_mode: bool = False,
    tokenizer: str | None = None,
) -> BackendOptions:
    """Bundle and validate the backend flags."""
    options = BackendOptions(
        kind=backend, model=model, base_url=base_url, epsilon=epsilon, seed=seed,
        temperature=temperature, max_tokens=max_tokens, token_mode=token_mode,
        tokenizer=tokenizer,
    )  # fmt: skip
    options.check()
    return options


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
) -> HarborOptions:
    """Bundle and validate the Harbor flags."""
    from ..adapters.harbor.image import parse_alias

    pairs = []
    for text in base_images or []:
        try:
            pairs.append(parse_alias(text))
        except ValueError as exc:
            raise CliError(f"--base-image: {exc}") from None
    if build_ca_bundle is not None:
        path = Path(build_ca_bundle).expanduser()
        if not path.is_file():
            raise CliError(f"--build-ca-bundle {build_ca_bundle!r}: no such file")
        build_ca_bundle = str(path.resolve())
    if provision_verifier and not build_network:
        raise CliError("--provision-verifier fetches at build time: it needs --build-network")
    if provision_index_url is not None and not provision_verifier:
        raise CliError("--provision-index-url is the index of --provision-verifier")
    if command_timeout is not None and not command_timeout > 0:
        raise CliError(f"--command-timeout must be > 0 seconds, got {command_timeout}")
    if runtime not in ("runc", "gvisor"):
        raise CliError(f"--runtime must be 'runc' or 'gvisor', got {runtime!r}")
    if artifacts_dir is not None:
        if artifacts_dir.exists() and not artifacts_dir.is_dir():
            raise CliError(f"--artifacts-dir {str(artifacts_dir)!r} is not a directory")
        artifacts_dir = artifacts_dir.expanduser().resolve()
    if start_step is not None and not start_step.strip():
        raise CliError("--start-step needs a step name")
    return HarborOptions(
        base_images=tuple(pairs), build_network=build_network, build_ca_bundle=build_ca_bundle,
        allow_network=allow_network, command_timeout=command_timeout,
        provision_verifier=provision_verifier, runtime=runtime,
        artifacts_dir=None if artifacts_dir is None else str(artifacts_dir),
        start_step=start_step, provision_index_url=provision_index_url,
    )  # fmt: skip
