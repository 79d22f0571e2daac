"""``llenvs-async view``: results and estimates in the browser (run list, trajectories,
value tree), served on 127.0.0.1 or written as one self-contained HTML file.

Stack: the stdlib ``http.server`` and vanilla JS/CSS shipped as package data, inlined into
the page. No registry, CDN or build step at run time, nothing beyond the core install, and
the ``--html`` file opens from ``file://`` anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import CliError, console

__all__ = ["view"]


def view(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Results JSONL of `run`; JSON of `q-values --json`, JSONL of its --trajectories; "
            "ATIF files or directories (Harbor trials)."
        ),
    ],
    port: Annotated[
        int, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")
    ] = 0,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write one self-contained HTML file instead of serving."),
    ] = None,
) -> None:
    """Browse trajectories and V(s) / Q(s, a) estimates in a local web page."""
    from ..viewer.model import ViewerInputError, load_files

    if not 0 <= port <= 65535:
        raise CliError(f"--port must be in 0..65535, got {port}")
    if html is not None and not html.parent.is_dir():
        raise CliError(f"--html {str(html)!r}: directory {str(html.parent)!r} does not exist")
    try:
        document, details = load_files(files)
    except ViewerInputError as exc:
        raise CliError(str(exc), code=2) from None
    what = f"{len(document['runs'])} trajectories, {len(document['values'])} estimated states"
    behind = len(details) - len(document["runs"])
    what += f", {behind} rollouts behind them" if behind else ""
    if html is not None:
        from ..viewer.page import render_page

        html.write_text(render_page(document, details), encoding="utf-8")
        console.print(f"wrote {html} ({what})")
        return
    _serve(document, details, port, what)


def _serve(document: Any, details: Sequence[Any], port: int, what: str) -> None:
    from ..viewer.server import ViewerServer

    try:
        server = ViewerServer(document, details, port)
    except OSError as exc:
        raise CliError(f"--port {port}: cannot listen on 127.0.0.1 ({exc.strerror})") from None
    try:
        print(f"serving {what} at {server.url} (Ctrl-C to stop)", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.close()
