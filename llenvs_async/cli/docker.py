"""``llenvs-async images build-base|build-standins`` and ``llenvs-async cleanup`` (the Docker
layer's tools)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ._common import console, run_async

__all__ = ["cleanup", "images_app"]

images_app = typer.Typer(help="Local images (no registry needed).", no_args_is_help=True)


@images_app.command("build-base")
def build_base(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if it exists.")] = False,
) -> None:
    """Build the Debian base image so `FROM debian:bookworm-slim` builds offline."""
    from ..docker.engine import DockerEngine
    from ..docker.images import ensure_base_image

    async def body() -> tuple[tuple[str, ...], str, bool, float]:
        async with DockerEngine() as engine:
            info = await ensure_base_image(engine, force=force)
        return info.tags, info.id, info.built, info.seconds

    tags, image_id, built, seconds = run_async(body)
    verb = f"built in {seconds:.1f}s" if built else "already present"
    console.print(f"{', '.join(tags)} ({image_id[:19]}): {verb}", markup=False)


@images_app.command("build-standins")
def build_standins(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if they exist.")] = False,
) -> None:
    """Build local stand-ins for official bases (debian:*, ubuntu:*, python:3*) from Debian's
    packages (the host's network, once), so Harbor tasks naming them build offline."""
    from ..docker.engine import DockerEngine
    from ..docker.images import STANDIN_PATTERNS, ImageInfo, ensure_standin_images

    async def body() -> list[ImageInfo]:
        async with DockerEngine() as engine:
            return await ensure_standin_images(engine, force=force)

    for info in run_async(body):
        verb = f"built in {info.seconds:.1f}s" if info.built else "already present"
        console.print(f"{', '.join(info.tags)} ({info.id[:19]}): {verb}", markup=False)
    for pattern, image in STANDIN_PATTERNS:
        console.print(f"  {pattern} -> {image}", markup=False)


def cleanup() -> None:
    """Remove containers, snapshot images, gVisor sandboxes and checkpoints left behind by
    llenvs processes that are gone."""
    from ..docker.engine import DockerEngine
    from ..docker.reaper import ReapedContainer, reap_orphans
    from ..docker.snapshots import ReapedImage, reap_orphan_snapshots

    async def body() -> tuple[list[ReapedContainer], list[ReapedImage]]:
        async with DockerEngine() as engine:
            containers = await reap_orphans(engine)  # first: a used image cannot be removed
            return containers, await reap_orphan_snapshots(engine)

    removed, images = run_async(body)
    if not removed:
        console.print("no orphaned containers")
    else:
        table = Table(title=f"removed {len(removed)} orphaned containers")
        for column in ("id", "name", "image", "owner", "session"):
            table.add_column(column)
        for c in removed:
            table.add_row(c.id[:12], c.name, c.image, c.owner, c.session)
        console.print(table)
    if images:
        console.print(f"removed {len(images)} orphaned snapshot image(s)")
    _cleanup_sandboxes()


def _cleanup_sandboxes() -> None:
    """gVisor sandboxes and checkpoint images of gone owners (when runsc is installed)."""
    from ..errors import GvisorUnavailableError
    from ..sandbox.reaper import reap_orphan_sandboxes

    try:
        reaped = reap_orphan_sandboxes()
    except GvisorUnavailableError:
        return  # no gVisor here: nothing of ours can exist
    sandboxes = [r for r in reaped if r.kind == "sandbox"]
    checkpoints = sum(r.kind == "checkpoint" for r in reaped)
    if sandboxes:
        console.print(f"removed {len(sandboxes)} orphaned gVisor sandbox(es)")
    if checkpoints:
        console.print(f"removed {checkpoints} orphaned checkpoint image(s)")
