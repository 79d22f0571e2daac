"""Typer option declarations shared by several commands."""

from __future__ import annotations

from typing import Annotated

import typer

from ._backend import BackendKind, BackendOptions

__all__ = [
    "BackendOpt",
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
    "SeedOpt",
    "TemperatureOpt",
    "backend_options",
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
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No live progress display.")]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        envvar="RAY_ADDRESS",
        help="Run each instance in a Ray actor on this cluster (host:port); needs [ray].",
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
) -> BackendOptions:
    """Bundle and validate the backend flags."""
    options = BackendOptions(
        kind=backend, model=model, base_url=base_url, epsilon=epsilon, seed=seed,
        temperature=temperature, max_tokens=max_tokens,
    )  # fmt: skip
    options.check()
    return options
