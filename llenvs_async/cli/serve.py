"""Harbor tasks served to other projects' clients: ``llenvs-async serve-openenv TASKS``
(OpenEnv's server, one fresh container-backed instance per WebSocket session,
``llenvs_async.integrations.openenv``) and ``llenvs-async serve-verifiers TASKS`` (verifiers'
own env server for prime-rl, one container per episode, ``llenvs_async.integrations.verifiers``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, cast

import anyio
import typer

from . import _options as opt
from ._common import CliError, run_async
from ._sources import SourceSpec, open_source

__all__ = ["serve_openenv", "serve_verifiers"]

TOKEN_ENV = "LLENVS_OPENENV_TOKEN"


def serve_openenv(
    dataset: Annotated[str, typer.Argument(help="Harbor dataset: a directory or name@version.")],
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (non-loopback: --allow-remote).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0: a free one).")] = 8000,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help=f"Allow a non-loopback --host (needs the token in ${TOKEN_ENV})."
        ),
    ] = False,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", help="Live sessions (containers) at most.")
    ] = 8,
    idle_timeout: Annotated[
        float, typer.Option("--idle-timeout", help="Seconds before an idle session ends.")
    ] = 600.0,
    max_steps: opt.MaxStepsOpt = None,
    action_format: opt.ActionFormatOpt = "text",
    allow_network: opt.AllowNetworkOpt = False,
    command_timeout: opt.CommandTimeoutOpt = None,
    runtime: opt.RuntimeOpt = "runc",
    base_image: opt.BaseImageOpt = None,
) -> None:
    """Serve Harbor tasks to OpenEnv clients (EnvClient, TRL, SkyRL, ...) over /ws."""
    from ..integrations.openenv import create_app, is_loopback, serving

    token = os.environ.get(TOKEN_ENV) or None
    if not is_loopback(host) and not allow_remote:
        raise CliError(f"--host {host!r} is not a loopback address: add --allow-remote")
    if not is_loopback(host) and token is None:
        raise CliError(f"--host {host!r} needs a bearer token in ${TOKEN_ENV} (16+ characters)")
    if max_concurrent < 1:
        raise CliError(f"--max-concurrent must be >= 1, got {max_concurrent}")
    if not idle_timeout > 0:
        raise CliError(f"--idle-timeout must be > 0 seconds, got {idle_timeout}")
    if not 0 <= port <= 65535:
        raise CliError(f"--port must be in 0..65535, got {port}")
    harbor = opt.harbor_options(
        base_image, False, None, allow_network, command_timeout, False, runtime, None, None, None,
        action_format=action_format,
    )  # fmt: skip
    spec = SourceSpec.from_flags(dataset, None, max_steps, harbor)

    async def serve() -> None:
        async with open_source(spec) as source:
            await source.check()
            assert source.env_factory is not None  # a Harbor source always has one
            try:
                app = create_app(
                    source.env_factory,
                    max_concurrent=max_concurrent,
                    idle_timeout_s=idle_timeout,
                    token=token,
                )
            except ValueError as exc:
                raise CliError(f"${TOKEN_ENV}: {exc}") from None
            async with serving(app, host=host, port=port, allow_remote=allow_remote) as url:
                print(
                    f"serving {len(source.tasks)} tasks of {spec.dataset} to OpenEnv clients at "
                    f"{url} (WebSocket {url.replace('http', 'ws', 1)}/ws; Ctrl-C to stop)",
                    flush=True,
                )
                await anyio.sleep_forever()

    run_async(serve)


def serve_verifiers(
    tasks: Annotated[Path, typer.Argument(help="A local directory of Harbor tasks.")],
    address: Annotated[
        str,
        typer.Option(
            "--address",
            help="ZMQ address to bind: tcp://127.0.0.1:PORT (loopback only; :0 picks a port) "
            "or ipc://PATH.",
        ),
    ] = "tcp://127.0.0.1:5000",
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", help="Episodes (containers) in flight at most.")
    ] = 4,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Steps per episode.")] = 30,
    action_format: opt.ActionFormatOpt = "tools",
    runtime: opt.RuntimeOpt = "runc",
) -> None:
    """Serve Harbor tasks to prime-rl's orchestrator (verifiers' EnvClient) over ZMQ."""
    from ..docker.runtime import runtime_names
    from ..integrations.verifiers import env_config, serving
    from ..protocols import PROTOCOLS

    opt.check_choice("--action-format", action_format, PROTOCOLS)
    opt.check_choice("--runtime", runtime, runtime_names())
    if max_concurrent < 1:
        raise CliError(f"--max-concurrent must be >= 1, got {max_concurrent}")
    if max_steps < 1:
        raise CliError(f"--max-steps must be >= 1, got {max_steps}")
    if not tasks.is_dir():
        raise CliError(f"TASKS must be a local directory of Harbor tasks, got {str(tasks)!r}")
    config = env_config(
        tasks,
        max_steps=max_steps,
        action_format=cast(Literal["text", "tools"], action_format),
        container_runtime=cast(Literal["runc", "gvisor"], runtime),
    )

    async def serve() -> None:
        async with serving(config, address=address, max_concurrent=max_concurrent) as server:
            print(
                f"serving the Harbor tasks of {tasks} to verifiers env clients at "
                f"{server.address} (env id {config.taskset.id}; Ctrl-C to stop)",
                flush=True,
            )
            await anyio.sleep_forever()

    run_async(serve)
