"""Task images: each task's ``environment/`` built once, tagged by a hash of its content.

No registry is ever contacted: every image a Dockerfile or a task names resolves to a local
one (``image_names.py``), each substitution logged as a warning, and a name that resolves to
nothing is an ``ImageError`` naming it and saying how to map it, before any build starts.
The Dockerfile is rewritten to those images and tarred with its context
(``dockerfile.py``); the tag is ``llenvs-harbor/<task>:<content-hash>``, so an unchanged
task is never rebuilt.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ....docker.engine import DockerEngine
from ....docker.images import STANDIN_PYTHON, build_image, tag_slug
from ....errors import ImageError
from ..tasks.task import HarborTask
from .dockerfile import (
    CA_BUNDLE_PATH,
    ImageUse,
    context_tar,
    image_uses,
    rewrite_from_lines,
    rewrite_images,
)
from .image_names import ImageResolver, normalise_image_ref, parse_alias, uv_version
from .provision import VerifierProvision, detect_provision, provision_dockerfile, provision_hint
from .uv_standin import with_uv_stages

__all__ = [
    "CA_BUNDLE_PATH",
    "TASK_IMAGE_LABEL",
    "BuildSettings",
    "ImageResolver",
    "TaskImages",
    "context_tar",
    "normalise_image_ref",
    "parse_alias",
    "rewrite_from_lines",
]

TASK_IMAGE_LABEL = "llenvs.harbor.task"
_log = logging.getLogger("llenvs_async.harbor")
_PYTHON_TAG_RE = re.compile(r"^python:(3\.\d+)")
_CERT_HINTS = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|self[- ]signed certificate|"
    r"unable to get local issuer certificate|invalid peer certificate|UnknownIssuer|"
    r"SSL certificate problem",
    re.IGNORECASE,
)
_NETWORK_HINTS = re.compile(
    r"Temporary failure resolving|Could not resolve|Name or service not known|"
    r"Failed to establish a new connection|Network is unreachable|unable to access|"
    r"No matching distribution found",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildSettings:
    """How task images are built: ``network`` (the host's network, off by default; apt/pip
    during a build need it) and ``ca_bundle`` (a host CA file copied into every build stage
    and named by ``SSL_CERT_FILE``/``PIP_CERT``/``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``)."""

    network: bool = False
    ca_bundle: Path | None = None
    provision_verifier: bool = False
    """Provision what a recognised uv/uvx or pip ``test.sh`` fetches (``provision.py``)."""
    provision_index_url: str | None = None
    """The package index provisioning downloads from; ``None``: pip's and uv's default."""


class TaskImages:
    """Builds and remembers task images; one build at a time per task (a lock per tag)."""

    def __init__(
        self,
        aliases: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        build: BuildSettings | None = None,
    ) -> None:
        self.resolver = ImageResolver(aliases)
        self.build = build or BuildSettings()
        self._locks: dict[str, asyncio.Lock] = {}
        self._ready: dict[str, str] = {}
        self._by_task: dict[Path, str] = {}  # by task dir or sidecar Dockerfile
        self._task_locks: dict[Path, asyncio.Lock] = {}
        self._warned: set[tuple[str, str]] = set()
        self._provisioned: set[Path] = set()  # tasks whose image fetched the verifier's needs
        self._python_gaps: dict[Path, str] = {}  # tasks on a stand-in of another Python
        self.builds = 0

    def provisioned(self, task: HarborTask) -> bool:
        """Whether ``task`` runs in an image built with its verifier's downloads (so its
        ``test.sh`` runs offline); ``False`` for a prebuilt image, even with a Dockerfile."""
        return task.path in self._provisioned

    def python_gap(self, task: HarborTask) -> str | None:
        """When ``task`` runs on a stand-in whose Python is not the one its image names:
        ``"the task asked for python:3.12-slim; the stand-in ... has Python 3.11"``."""
        return self._python_gaps.get(task.path)

    @property
    def aliases(self) -> dict[str, str]:
        return dict(self.resolver.aliases)

    async def ensure(self, engine: DockerEngine, task: HarborTask) -> str:
        """The local image to run ``task`` in: its prebuilt image, or its built Dockerfile.
        Worked out once per task (the build context is tarred and hashed once), then cached.
        """
        known = self._by_task.get(task.path)
        if known is not None:
            return known
        async with self._task_locks.setdefault(task.path, asyncio.Lock()):
            if task.path not in self._by_task:
                self._by_task[task.path] = await self._ensure(engine, task)
        return self._by_task[task.path]

    async def _ensure(self, engine: DockerEngine, task: HarborTask) -> str:
        prebuilt = task.config.environment.docker_image
        if prebuilt is not None:
            ref = await self.resolver.resolve(engine, prebuilt)
            if ref is not None:
                self._warn(task, prebuilt, ref)
                return ref
            if task.dockerfile is None:
                raise ImageError(
                    f"task {task.name!r} needs image {prebuilt!r}, which is not present locally "
                    f"({self.resolver.how_to_map(prebuilt)})"
                )
        assert task.dockerfile is not None
        return await self._ensure_built(
            engine, task, task.dockerfile, task.short_name, provision=self.build.provision_verifier
        )

    async def ensure_verifier(self, engine: DockerEngine, task: HarborTask) -> str:
        """The image of a separate verifier: ``[verifier.environment].docker_image`` when it
        resolves locally, else ``tests/Dockerfile`` built with ``tests/`` as its context."""
        key = task.tests_dir / "Dockerfile"
        known = self._by_task.get(key)
        if known is not None:
            return known
        async with self._task_locks.setdefault(key, asyncio.Lock()):
            if key not in self._by_task:
                env = task.config.verifier.environment
                prebuilt = env.docker_image if env is not None else None
                ref = await self.resolver.resolve(engine, prebuilt) if prebuilt else None
                if ref is not None:
                    assert prebuilt is not None
                    self._warn(task, prebuilt, ref)
                elif not key.is_file():
                    assert prebuilt is not None
                    raise ImageError(
                        f"task {task.name!r}: its verifier needs image {prebuilt!r}, which is "
                        f"not present locally ({self.resolver.how_to_map(prebuilt)})"
                    )
                else:
                    ref = await self._ensure_built(engine, task, key, f"{task.short_name}-verifier")
                self._by_task[key] = ref
        return self._by_task[key]

    async def ensure_built(
        self, engine: DockerEngine, task: HarborTask, dockerfile_path: Path, *, service: str
    ) -> str:
        """The image of one of ``task``'s compose sidecar ``service``s, built from
        ``dockerfile_path`` (its directory is the context), worked out once per service."""
        known = self._by_task.get(dockerfile_path)
        if known is not None:
            return known
        async with self._task_locks.setdefault(dockerfile_path, asyncio.Lock()):
            if dockerfile_path not in self._by_task:
                slug = f"{task.short_name}-{service}"
                self._by_task[dockerfile_path] = await self._ensure_built(
                    engine, task, dockerfile_path, slug
                )
        return self._by_task[dockerfile_path]

    async def _ensure_built(
        self,
        engine: DockerEngine,
        task: HarborTask,
        dockerfile_path: Path,
        slug: str,
        *,
        provision: bool = False,
    ) -> str:
        """Build ``dockerfile_path`` (its directory is the context) unless its tag exists;
        ``provision``: with what the verifier downloads fetched at build time."""
        dockerfile = await asyncio.to_thread(dockerfile_path.read_text, encoding="utf-8")
        provided = await asyncio.to_thread(_provision_of, task) if provision else None
        if provided is not None:
            self._provisioned.add(task.path)
            index_url = self.build.provision_index_url
            dockerfile = provision_dockerfile(dockerfile, provided, index_url=index_url)
        dockerfile = await self._uv_standins(engine, dockerfile)
        uses = []
        for index, kind, written in image_uses(dockerfile):
            image = await self.resolver.resolve(engine, written)
            if image is None:
                where = f"{kind} on line {index + 1} of {dockerfile_path}"
                raise ImageError(
                    f"task {task.name!r}: image {written!r} ({where}) is not present locally; "
                    f"{self.resolver.how_to_map(written)}"
                )
            self._warn(task, written, image)
            uses.append(ImageUse(written=written, line=index, image=image, kind=kind))
        text = rewrite_images(dockerfile, uses, self.build.ca_bundle is not None)
        context, content_hash = await asyncio.to_thread(
            functools.partial(
                context_tar,
                task,
                text,
                self.build.ca_bundle,
                root=dockerfile_path.parent,
                dockerfile_name=dockerfile_path.name,
            )
        )
        tag = f"llenvs-harbor/{tag_slug(slug)}:{content_hash}"
        if tag in self._ready:
            return tag
        lock = self._locks.setdefault(tag, asyncio.Lock())
        async with lock:
            if tag not in self._ready:
                if await engine.inspect_image(tag) is None:
                    base = next((u for u in reversed(uses) if u.kind == "FROM"), None)
                    hint = functools.partial(self._diagnose, provided=provided, base=base)
                    await self._build(engine, task, context, tag, dockerfile_path, hint)
                self._ready[tag] = tag
        return tag

    async def _uv_standins(self, engine: DockerEngine, dockerfile: str) -> str:
        """``dockerfile`` with a stage built from the uv wheel for each astral-sh/uv image it
        names that no local image answers to (``uv_standin.py``), when the build has a
        network to fetch the wheel with."""
        if not self.build.network:
            return dockerfile
        missing = {
            written
            for _, _, written in image_uses(dockerfile)
            if uv_version(written) is not None
            and await self.resolver.resolve(engine, written) is None
        }
        return with_uv_stages(dockerfile, missing, index_url=self.build.provision_index_url)

    def _warn(self, task: HarborTask, written: str, image: str) -> None:
        """Say which local image stands in for a name: a warning when it is another image
        (and remember a stand-in of another Python: ``python_gap``)."""
        if image == written:
            return
        has = STANDIN_PYTHON.get(image)
        wants = _PYTHON_TAG_RE.match(normalise_image_ref(written))
        python = ""
        if has is not None and wants is not None and wants[1] != has:
            python = f" (a stand-in with Python {has}, not {wants[1]})"
            self._python_gaps[task.path] = (
                f"the task asked for {written}; the stand-in {image} has Python {has}"
            )
        if (task.name, written) in self._warned:
            return
        self._warned.add((task.name, written))
        other = normalise_image_ref(image) != normalise_image_ref(written)
        level = logging.WARNING if other else logging.INFO
        _log.log(level, "task %s: using local image %s for %s%s", task.name, image, written, python)

    async def _build(
        self,
        engine: DockerEngine,
        task: HarborTask,
        context: bytes,
        tag: str,
        source: Path,
        diagnose: Callable[[Sequence[str]], str | None],
    ) -> None:
        settings = task.config.environment  # a verifier's own table when it has one
        if source.parent == task.tests_dir and task.config.verifier.environment is not None:
            settings = task.config.verifier.environment
        timeout = settings.build_timeout_sec
        try:
            async with asyncio.timeout(timeout):
                await build_image(
                    engine,
                    _chunks(context),
                    tag=tag,
                    labels={TASK_IMAGE_LABEL: task.name},
                    network=self.build.network,
                    what=f"building the image of task {task.name!r} ({source})",
                    dockerfile=source.name,
                    diagnose=diagnose,
                )
        except TimeoutError as exc:
            raise ImageError(
                f"building the image of task {task.name!r} took more than "
                f"build_timeout_sec={timeout:g}s"
            ) from exc
        self.builds += 1

    def _diagnose(
        self, log: Sequence[str], *, provided: VerifierProvision | None, base: ImageUse | None
    ) -> str | None:
        """Hints for a failed build's whole log: a failed provisioning step (``provided``;
        ``base``: the final stage's ``FROM``), no network, an untrusted TLS proxy."""
        hints = []
        if provided is not None:
            standin = None
            if base is not None and base.image in STANDIN_PYTHON:
                standin = (base.image, STANDIN_PYTHON[base.image])
            written = base.written if base is not None else "its base image"
            hints.append(provision_hint(log, provided, base=written, standin=standin))
        text = "\n".join(log)
        if not self.build.network and _NETWORK_HINTS.search(text):
            hints.append(
                "the build has no network: pass --build-network "
                "(HarborAdapter(build_network=True)) to build with the host's network"
            )
        elif self.build.ca_bundle is None and _CERT_HINTS.search(text):
            hints.append(
                "a download in the build did not trust the server's certificate (a "
                "TLS-intercepting proxy?): pass --build-ca-bundle FILE, e.g. "
                "/etc/ssl/certs/ca-certificates.crt (HarborAdapter(build_ca_bundle=...))"
            )
        return "\n".join(hint for hint in hints if hint) or None


def _provision_of(task: HarborTask) -> VerifierProvision | None:
    """What ``task``'s ``test.sh`` fetches, when it has a recognised shape (else logged)."""
    provision = detect_provision((task.tests_dir / "test.sh").read_text(encoding="utf-8"))
    if provision is None:
        _log.info("task %s: test.sh has no recognised uv/pip shape; not provisioned", task.name)
    return provision


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 1 << 20):
        yield data[start : start + (1 << 20)]
