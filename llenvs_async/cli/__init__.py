"""The ``llenvs-async`` command line: one module per command group, one ``anyio.run`` each.

Bad flags, paths and inputs end in ONE line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

import typer
from typer.main import get_command

from ..errors import LlenvsError
from ..serialization.results import ResultsError
from ._common import CliError
from .atif import import_atif
from .bench import bench as bench_command
from .docker import cleanup, images_app
from .export import export
from .models import models_app
from .qvalues import q_values
from .replay import validate_replay
from .run import run as run_command
from .serve import serve_openenv, serve_verifiers
from .tasks import tasks_app
from .view import view

__all__ = ["app", "main"]

app = typer.Typer(
    name="llenvs-async",
    help="Collect LLM-agent trajectories and estimate V(s) / Q(s, a) by Monte Carlo rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run_command)
app.command("q-values")(q_values)
app.command("validate-replay")(validate_replay)
app.command("cleanup")(cleanup)
app.command("export")(export)
app.command("import-atif")(import_atif)
app.command("view")(view)
app.command("serve-openenv")(serve_openenv)
app.command("serve-verifiers")(serve_verifiers)
app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    bench_command
)
app.add_typer(tasks_app, name="tasks")
app.add_typer(images_app, name="images")
app.add_typer(models_app, name="models")


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    """Turn SIGTERM (job schedulers, ``timeout``, ``kill``) into SIGINT, so the event loop
    cancels the run the same graceful way: results kept, every container removed."""
    os.kill(os.getpid(), signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns (and exits with) the status code."""
    if argv is None:  # a real process (not a test calling main(args)): SIGTERM acts as Ctrl-C
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    args = list(sys.argv[1:] if argv is None else argv)
    command = get_command(app)
    try:
        result = command.main(args, prog_name="llenvs-async", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except CliError as exc:
        code = _fail(str(exc), exc.code)
    except ResultsError as exc:  # a bad source flag or results record: bad input, as CliError
        code = _fail(str(exc), 2)
    except (LlenvsError, OSError) as exc:
        code = _fail(str(exc), 1)
    except BaseExceptionGroup as group:
        first = _first_leaf(group)
        if not isinstance(first, LlenvsError | OSError):
            raise
        code = _fail(str(first), 1)
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except Exception as exc:
        format_message = getattr(exc, "format_message", None)
        if not callable(format_message):
            raise  # a bug: keep the traceback
        if type(exc).__name__ == "NoArgsIsHelpError":
            command.main([*args, "--help"], prog_name="llenvs-async", standalone_mode=False)
            code = 0 if not args else 2
        else:  # click's usage errors (bad flags, bad values): one line
            code = _fail(str(format_message()), int(getattr(exc, "exit_code", 2)))
    if argv is None:
        sys.exit(code)
    return code


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _fail(message: str, code: int) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return code
