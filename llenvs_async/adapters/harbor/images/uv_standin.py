"""Stand-ins for astral-sh/uv's images: ``COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx
/bin/`` (or ``FROM ghcr.io/astral-sh/uv:0.8.15 AS uv``) builds without a registry.

Where no local image answers to the name and the build has a network, the Dockerfile gets a
stage of its own instead: ``python:3`` (a stand-in like any other ``FROM``) downloads the
``uv`` wheel of that version from the package index (``--provision-index-url`` if given)
and puts its ``uv`` and ``uvx`` at ``/uv`` and ``/uvx``, where the upstream image has them;
the task's references name that stage. Built with the task's image, so cached with it.
"""

from __future__ import annotations

import re
import shlex

from .dockerfile import ImageUse, image_uses, rewrite_images
from .image_names import uv_version

__all__ = ["with_uv_stages"]

_FIRST_FROM_RE = re.compile(r"^\s*FROM\s", re.IGNORECASE)
_STAGE_IMAGE = "python:3.12-slim"


def _stage_name(version: str) -> str:
    return f"llenvs-uv-{version.replace('.', '-')}"


def with_uv_stages(dockerfile: str, refs: set[str], *, index_url: str | None = None) -> str:
    """``dockerfile`` with a uv stage for each name in ``refs`` (uv image names that have
    no local image) and every reference to one naming its stage instead."""
    renamed = [
        ImageUse(written=written, line=index, image=_stage_name(version), kind=kind)
        for index, kind, written in image_uses(dockerfile)
        if written in refs and (version := uv_version(written)) is not None
    ]
    if not renamed:
        return dockerfile
    index = f"--index-url {shlex.quote(index_url)} " if index_url else ""
    stages = [
        f"FROM {_STAGE_IMAGE} AS {_stage_name(version)}\n"
        f"RUN echo 'llenvs-async: uv {version} from its wheel (a stand-in for "
        f"ghcr.io/astral-sh/uv:{version})' && python3 -m pip download {index}--no-deps "
        f"--only-binary=:all: -d /llenvs-w uv=={version} && python3 -m zipfile -e "
        "/llenvs-w/uv-*.whl /llenvs-x && cp /llenvs-x/uv-*.data/scripts/uv "
        "/llenvs-x/uv-*.data/scripts/uvx / && chmod 755 /uv /uvx && rm -rf /llenvs-w /llenvs-x"
        for version in dict.fromkeys(uv_version(use.written) or "" for use in renamed)
    ]
    lines = rewrite_images(dockerfile, renamed, ca_bundle=False).split("\n")
    first = next(i for i, line in enumerate(lines) if _FIRST_FROM_RE.match(line))
    lines[first:first] = stages
    return "\n".join(lines)
