"""Task images: each task's ``environment/`` built once, tagged by a hash of its content.

No registry is ever contacted. Every image a Dockerfile names (``FROM``, ``COPY --from=``,
``ARG``-expanded) or a task's prebuilt ``docker_image`` resolves to a LOCAL image, in order:
the user's aliases (``fnmatch`` patterns, on the name as written or normalised), the
normalised name itself when present (``docker.io/library/``, ``public.ecr.aws/docker/library/``
and ``@sha256:`` digests dropped, ``:latest`` added), then the built-in stand-ins
(``debian:*``, ``ubuntu:*`` -> our bookworm base, ``python:3*`` -> bookworm + python3/pip;
see ``STANDIN_PATTERNS``). Each substitution is logged as a warning. A name that resolves
to nothing is an ``ImageError`` naming it and saying how to map it, before any build starts.
The tag is ``llenvs-harbor/<task>:<content-hash>``, so an unchanged task is never rebuilt.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import hashlib
import io
import logging
import re
import tarfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...docker.engine import DockerEngine
from ...docker.images import STANDIN_PATTERNS, STANDIN_PYTHON, build_image, tag_slug
from ...errors import ImageError
from .provision import VerifierProvision, detect_provision, provision_dockerfile, provision_hint
from .task import HarborTask

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
CA_BUNDLE_PATH = "/usr/local/share/ca-certificates/llenvs-build-ca.crt"
_CA_CONTEXT_NAME = ".llenvs-build-ca.crt"
_log = logging.getLogger("llenvs_async.harbor")
_FROM_RE = re.compile(
    r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE
)
_ARG_RE = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.IGNORECASE)
_STAGE_RE = re.compile(r"\s+AS\s+(\S+)\s*$", re.IGNORECASE)
_COPY_FROM_RE = re.compile(r"^(\s*(?:COPY|ADD)\s+(?:--\S+\s+)*?--from=)(\S+)", re.IGNORECASE)
_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_DOCKER_HUB_PREFIXES = (
    "docker.io/library/",
    "index.docker.io/library/",
    "registry-1.docker.io/library/",
    "public.ecr.aws/docker/library/",
    "mirror.gcr.io/library/",
    "docker.io/",
    "index.docker.io/",
    "registry-1.docker.io/",
    "library/",
)
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


def normalise_image_ref(ref: str) -> str:
    """``repository:tag`` of an image reference: registry prefix of Docker Hub's official
    images and any ``@sha256:`` digest dropped, ``:latest`` when no tag is given."""
    name = ref.split("@", 1)[0]
    lowered = name.lower()
    for prefix in _DOCKER_HUB_PREFIXES:
        if lowered.startswith(prefix):
            name = name[len(prefix) :]
            break
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def parse_alias(text: str) -> tuple[str, str]:
    """``"PATTERN=IMAGE"`` (the CLI's ``--base-image``) -> ``(PATTERN, IMAGE)``."""
    pattern, sep, image = text.partition("=")
    if not sep or not pattern.strip() or not image.strip():
        raise ValueError(
            f"a base-image alias is PATTERN=IMAGE (e.g. 'python:3.*=myimg'), got {text!r}"
        )
    return pattern.strip(), image.strip()


def _matches(pattern: str, ref: str) -> bool:
    return fnmatch.fnmatchcase(ref, pattern) or fnmatch.fnmatchcase(
        normalise_image_ref(ref), pattern
    )


def rewrite_from_lines(dockerfile: str, aliases: Mapping[str, str]) -> str:
    """Replace base images matched by ``aliases`` (exact names or patterns) on ``FROM`` lines."""
    if not aliases:
        return dockerfile

    def sub(match: re.Match[str]) -> str:
        image = next((v for k, v in aliases.items() if _matches(k, match[2])), match[2])
        return f"{match[1]}{image}{match[3]}"

    return _FROM_RE.sub(sub, dockerfile)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Use:
    """One image a Dockerfile names, where, and what it resolved to."""

    written: str
    line: int
    image: str
    kind: str


class ImageResolver:
    """Maps the image names tasks use to local images (see the module docstring)."""

    def __init__(self, aliases: Mapping[str, str] | Sequence[tuple[str, str]] = ()) -> None:
        pairs = list(aliases.items()) if isinstance(aliases, Mapping) else list(aliases)
        self.aliases: tuple[tuple[str, str], ...] = tuple(pairs)
        self._local: dict[str, bool] = {}

    async def _present(self, engine: DockerEngine, ref: str) -> bool:
        if ref not in self._local:
            self._local[ref] = await engine.inspect_image(ref) is not None
        return self._local[ref]

    async def resolve(self, engine: DockerEngine, ref: str) -> str | None:
        """The local image for ``ref``, or ``None`` when nothing matches locally."""
        for pattern, image in self.aliases:
            if _matches(pattern, ref):
                return image
        if await self._present(engine, ref):
            return ref
        normal = normalise_image_ref(ref)
        if await self._present(engine, normal):
            return normal
        for pattern, image in STANDIN_PATTERNS:
            if fnmatch.fnmatchcase(normal, pattern) and await self._present(engine, image):
                return image
        return None

    def how_to_map(self, ref: str) -> str:
        normal = normalise_image_ref(ref)
        standin = next(
            (img for pat, img in STANDIN_PATTERNS if fnmatch.fnmatchcase(normal, pat)), None
        )
        hint = (
            f"build its stand-in {standin} (Python {STANDIN_PYTHON[standin]}) with "
            "`llenvs-async images build-standins`, or "
            if standin
            else ""
        )
        return (
            f"no registry is reachable: {hint}map it to a local image with "
            f"--base-image '{normal}=IMAGE' (HarborAdapter(base_image_aliases={{'{normal}': "
            "IMAGE}), patterns such as 'python:3.*' allowed)"
        )


def _expand(text: str, args: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match[1] or match[3]
        value = args.get(name, "")
        return value or (match[2] or "")

    return _VAR_RE.sub(sub, text)


def _image_uses(dockerfile: str) -> list[tuple[int, str, str]]:
    """``(line index, kind, image as written after ARG expansion)`` for every external image
    (``FROM``/``COPY --from``; stage names, stage indices and ``scratch`` excluded)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    uses: list[tuple[int, str, str]] = []
    seen_from = False
    for index, line in enumerate(dockerfile.split("\n")):
        if (arg := _ARG_RE.match(line)) and not seen_from:
            args[arg[1]] = arg[2] or ""
        elif from_match := _FROM_RE.match(line):
            seen_from = True
            image = _expand(from_match[2], args)
            if image.lower() not in stages and image.lower() != "scratch":
                uses.append((index, "FROM", image))
            if stage := _STAGE_RE.search(from_match[3]):
                stages.add(stage[1].lower())
        elif copy := _COPY_FROM_RE.match(line):
            source = _expand(copy[2], args)
            if source.lower() not in stages and not source.isdigit():
                uses.append((index, "COPY --from", source))
    return uses


def _rewrite(dockerfile: str, uses: Sequence[_Use], ca_bundle: bool) -> str:
    lines = dockerfile.split("\n")
    by_line = {use.line: use for use in uses}
    out: list[str] = []
    for index, line in enumerate(lines):
        use = by_line.get(index)
        if use is not None:
            if from_match := _FROM_RE.match(line):
                line = f"{from_match[1]}{use.image}{from_match[3]}"
            elif copy := _COPY_FROM_RE.match(line):
                line = f"{copy[1]}{use.image}{line[copy.end() :]}"
        out.append(line)
        if ca_bundle and _FROM_RE.match(line):
            out.append(f"COPY {_CA_CONTEXT_NAME} {CA_BUNDLE_PATH}")
            variables = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
            out.append("ENV " + " ".join(f"{var}={CA_BUNDLE_PATH}" for var in variables))
    return "\n".join(out)


def context_tar(
    task: HarborTask,
    dockerfile: str | Mapping[str, str],
    ca_bundle: Path | None = None,
    *,
    root: Path | None = None,
    dockerfile_name: str = "Dockerfile",
) -> tuple[bytes, str]:
    """The build context (``root``, default ``environment/``, with ``dockerfile`` as its
    ``dockerfile_name``, or the task's own rewritten through an alias mapping) as tar bytes,
    and its hash over paths, executable bits and contents (never mtimes)."""
    if not isinstance(dockerfile, str):
        assert task.dockerfile is not None
        dockerfile = rewrite_from_lines(task.dockerfile.read_text(encoding="utf-8"), dockerfile)
    root = root or task.environment_dir
    digest = hashlib.sha256()
    buf = io.BytesIO()

    def add_file(rel: str, data: bytes, info: tarfile.TarInfo) -> None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        digest.update(f"F {rel} {info.mode & 0o111:o} {len(data)}\n".encode())
        digest.update(data)

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                data = dockerfile.encode("utf-8") if rel == dockerfile_name else path.read_bytes()
                add_file(rel, data, info)
            else:
                tar.addfile(info)
                digest.update(f"{info.type.decode()} {rel} {info.linkname}\n".encode())
        if ca_bundle is not None:
            add_file(_CA_CONTEXT_NAME, ca_bundle.read_bytes(), tarfile.TarInfo(_CA_CONTEXT_NAME))
    return buf.getvalue(), digest.hexdigest()[:16]


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
        self.builds = 0

    def provisioned(self, task: HarborTask) -> bool:
        """Whether ``task`` runs in an image built with its verifier's downloads (so its
        ``test.sh`` runs offline); ``False`` for a prebuilt image, even with a Dockerfile."""
        return task.path in self._provisioned

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
        uses = []
        for index, kind, written in _image_uses(dockerfile):
            image = await self.resolver.resolve(engine, written)
            if image is None:
                where = f"{kind} on line {index + 1} of {dockerfile_path}"
                raise ImageError(
                    f"task {task.name!r}: image {written!r} ({where}) is not present locally; "
                    f"{self.resolver.how_to_map(written)}"
                )
            self._warn(task, written, image)
            uses.append(_Use(written=written, line=index, image=image, kind=kind))
        text = _rewrite(dockerfile, uses, self.build.ca_bundle is not None)
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

    def _warn(self, task: HarborTask, written: str, image: str) -> None:
        """Say which local image stands in for a name: a warning when it is another image."""
        if image == written or (task.name, written) in self._warned:
            return
        self._warned.add((task.name, written))
        other = normalise_image_ref(image) != normalise_image_ref(written)
        level = logging.WARNING if other else logging.INFO
        has = STANDIN_PYTHON.get(image)
        wants = _PYTHON_TAG_RE.match(normalise_image_ref(written))
        python = ""
        if has is not None and wants is not None and wants[1] != has:
            python = f" (a stand-in with Python {has}, not {wants[1]})"
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
        self, log: Sequence[str], *, provided: VerifierProvision | None, base: _Use | None
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
