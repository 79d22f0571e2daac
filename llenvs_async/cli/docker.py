"""``llenvs-async images build-base|build-standins|build-busybox|build-all`` (the one way to
build the local images) and ``llenvs-async cleanup`` (ends what processes that are gone left
behind: vLLM engine processes, containers, images, sandboxes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ._common import CliError, console, run_async

if TYPE_CHECKING:
    from ..docker.images import ImageInfo

__all__ = ["cleanup", "images_app"]

images_app = typer.Typer(help="Local images (no registry needed).", no_args_is_help=True)


def _report(images: list[ImageInfo]) -> None:
    for info in images:
        verb = f"built in {info.seconds:.1f}s" if info.built else "already present"
        console.print(
            f"{', '.join(info.tags)} ({info.id[:19]}): {verb}", markup=False, soft_wrap=True
        )


def _build(*, base: bool, standins: bool, busybox: bool, force: bool) -> list[ImageInfo]:
    from ..docker.engine import DockerEngine
    from ..docker.images import ensure_base_image, ensure_busybox_image, ensure_standin_images

    async def body() -> list[ImageInfo]:
        built: list[ImageInfo] = []
        async with DockerEngine() as engine:
            if base:
                built.append(await ensure_base_image(engine, force=force))
            if standins:
                built.extend((await ensure_standin_images(engine, force=force))[1:])
            if busybox:
                built.append(await ensure_busybox_image(engine, force=force))
        return built

    images = run_async(body)
    _report(images)
    return images


_FORCE = typer.Option("--force", help="Rebuild even if it exists.")


@images_app.command("build-base")
def build_base(force: Annotated[bool, _FORCE] = False) -> None:
    """Build the Debian base image so `FROM debian:bookworm-slim` builds offline."""
    _build(base=True, standins=False, busybox=False, force=force)


@images_app.command("build-standins")
def build_standins(
    force: Annotated[bool, _FORCE] = False,
    uv: Annotated[
        list[str] | None,
        typer.Option(
            "--uv", metavar="VERSION",
            help="Also ghcr.io/astral-sh/uv:VERSION (/uv, /uvx) from the uv wheel (repeatable).",
        ),
    ] = None,
    index_url: Annotated[
        str | None, typer.Option("--index-url", help="The package index for --uv's wheel.")
    ] = None,
) -> None:  # fmt: skip
    """Build local stand-ins for official bases (debian:*, ubuntu:*, python:3*) from Debian's
    packages (the host's network, once), so Harbor tasks naming them build offline; with
    --uv, uv's images too."""
    from ..docker.engine import DockerEngine
    from ..docker.images import STANDIN_PATTERNS, STANDIN_PYTHON, ensure_uv_standin

    _build(base=True, standins=True, busybox=False, force=force)
    for pattern, image in STANDIN_PATTERNS:
        python = STANDIN_PYTHON.get(image)
        console.print(f"  {pattern} -> {image}" + (f" (Python {python})" if python else ""))

    async def uv_images() -> list[ImageInfo]:
        async with DockerEngine() as engine:
            return [await ensure_uv_standin(engine, v, index_url=index_url, force=force)
                    for v in uv or ()]  # fmt: skip

    if uv:
        try:
            _report(run_async(uv_images))
        except ValueError as exc:
            raise CliError(str(exc)) from None


@images_app.command("build-busybox")
def build_busybox(force: Annotated[bool, _FORCE] = False) -> None:
    """Build the busybox image the tests and examples use (from the host's busybox-static)."""
    _build(base=False, standins=False, busybox=True, force=force)


@images_app.command("build-all")
def build_all(force: Annotated[bool, _FORCE] = False) -> None:
    """Everything the tests need: the base image, the stand-ins and busybox."""
    _build(base=True, standins=True, busybox=True, force=force)


def cleanup() -> None:
    """Remove vLLM engine processes, containers, snapshot images, gVisor sandboxes and
    checkpoints left behind by llenvs processes that are gone."""
    from .. import reap_all_orphans

    reaped = run_async(reap_all_orphans)
    for p in reaped.engines:
        console.print(
            f"ended orphaned vLLM engine process {p.pid} ({p.name}) of gone owner {p.owner_pid}",
            markup=False,
        )
    if not reaped.containers:
        console.print("no orphaned containers")
    else:
        table = Table(title=f"removed {len(reaped.containers)} orphaned containers")
        for column in ("id", "name", "image", "owner", "session"):
            table.add_column(column)
        for c in reaped.containers:
            table.add_row(c.id[:12], c.name, c.image, c.owner, c.session)
        console.print(table)
    if reaped.images:
        console.print(f"removed {len(reaped.images)} orphaned snapshot image(s)")
    sandboxes = sum(r.kind == "sandbox" for r in reaped.sandboxes)
    checkpoints = sum(r.kind == "checkpoint" for r in reaped.sandboxes)
    if sandboxes:
        console.print(f"removed {sandboxes} orphaned gVisor sandbox(es)")
    if checkpoints:
        console.print(f"removed {checkpoints} orphaned checkpoint image(s)")
