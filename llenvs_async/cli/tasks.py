"""``llenvs-async tasks list``: the tasks of a Harbor dataset or built-in env, in stable order."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from . import _options as opt
from ._common import console, run_async
from ._sources import SourceSpec, TaskRef, open_source

__all__ = ["tasks_app"]

tasks_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)


@tasks_app.command("list")
def list_tasks(dataset: opt.DatasetArg = None, env: opt.EnvOpt = None) -> None:
    """List every task (index, key, description); the index order is stable."""
    spec = SourceSpec.from_flags(dataset, env, None)
    refs = run_async(lambda: _load(spec))
    table = Table(title=spec.label)
    for column in ("index", "task", "description"):
        table.add_column(column)
    for i, ref in enumerate(refs):
        table.add_row(str(i), escape(str(ref.key)), escape(ref.description))
    console.print(table)


async def _load(spec: SourceSpec) -> list[TaskRef]:
    async with open_source(spec) as source:  # no container starts before a reset
        return source.tasks
