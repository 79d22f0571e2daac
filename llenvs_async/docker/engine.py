"""`DockerEngine`: one aiodocker client, its connection check, and error translation."""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
from collections.abc import AsyncIterable, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiodocker
import aiohttp

from .._ownership import current_owner, new_session_id, owner_labels
from ..errors import ClosedError, ContainerError, DockerUnavailableError, ImageError, LlenvsError

if TYPE_CHECKING:
    from aiodocker.containers import DockerContainer
    from aiodocker.execs import Exec
    from aiodocker.stream import Message, Stream

__all__ = ["DockerEngine", "ExecStream", "split_image_ref", "translate_errors"]

_UNREACHABLE = 900  # aiodocker's status for "cannot connect"


@contextmanager
def translate_errors(
    action: str, *, container_id: str | None = None, image: str | None = None
) -> Iterator[None]:
    """Turn aiodocker/aiohttp/OS errors raised inside the block into our error tree."""
    try:
        yield
    except aiodocker.DockerError as exc:
        status = int(exc.status)
        message = f"{action} failed: {exc.message}"
        if status == _UNREACHABLE:
            raise DockerUnavailableError(message, status=status) from exc
        if image is not None and status == 404:
            raise ImageError(message, status=status) from exc
        raise ContainerError(message, container_id=container_id, status=status) from exc
    except (aiohttp.ClientError, ConnectionError, FileNotFoundError) as exc:
        raise DockerUnavailableError(
            f"{action} failed: Docker engine unreachable ({exc})", container_id=container_id
        ) from exc
    except (AssertionError, AttributeError, TypeError) as exc:
        if not raised_inside_client(exc):
            raise  # our own (or the caller's) programming error: it must propagate
        # aiodocker/aiohttp assert on states they reach under load or a dropped connection
        # (e.g. "assert self._paused" in a stream): a failure of the client, not a bug of
        # the caller, so it is recorded on the rollout like any other Docker failure.
        raise ContainerError(
            f"{action} failed inside the Docker client: {type(exc).__name__}: {exc}",
            container_id=container_id,
        ) from exc


_CLIENT_PACKAGES = (f"{os.sep}aiodocker{os.sep}", f"{os.sep}aiohttp{os.sep}")


def raised_inside_client(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in aiodocker or aiohttp."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    return any(part in filename for part in _CLIENT_PACKAGES)


def _client(url: str | None) -> aiodocker.Docker:
    """An aiodocker client; on a local socket without aiohttp's 100-connection cap, since
    every open shell session holds one connection for its whole life."""
    target = url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if target.startswith("unix://"):
        connector = aiohttp.UnixConnector(target[len("unix://") :], limit=0)
        return aiodocker.Docker(url="unix://localhost", connector=connector)
    return aiodocker.Docker(url=url)


def split_image_ref(ref: str) -> tuple[str, str]:
    """``"repo/name:tag"`` -> ``("repo/name", "tag")``; the tag defaults to ``latest``."""
    repo, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return repo, tag


async def _close_client(client: aiodocker.Docker | None) -> None:
    if client is not None:
        await client.close()
        if not client.connector.closed:  # ours (see _client), not the client's
            await client.connector.close()


class DockerEngine:
    """Owns one ``aiodocker.Docker`` (local socket or ``DOCKER_HOST``); an async context manager.

    ``session_id`` is stamped on every container created through this engine.
    """

    def __init__(self, url: str | None = None, *, session_id: str | None = None) -> None:
        self.url = url
        self.session_id = session_id or new_session_id()
        self._client: aiodocker.Docker | None = None
        self._closed = False
        self._lock = asyncio.Lock()

    @property
    def client(self) -> aiodocker.Docker:
        """The connected aiodocker client (call ``connect`` first)."""
        if self._closed:
            raise ClosedError("DockerEngine")
        if self._client is None:
            raise ContainerError("DockerEngine is not connected: call `await engine.connect()`")
        return self._client

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        """Whether a client is open now (``disconnect`` drops it until the next ``connect``)."""
        return self._client is not None and not self._closed

    @property
    def labels(self) -> dict[str, str]:
        """Owner and session labels for a container created now by this process."""
        return owner_labels(self.session_id)

    async def connect(self) -> DockerEngine:
        """Open the client and check that an engine answers (idempotent)."""
        if self._closed:
            raise ClosedError("DockerEngine")
        async with self._lock:
            if self._client is not None:
                return self
            try:
                client = _client(self.url)
            except ValueError as exc:
                raise DockerUnavailableError(f"no Docker engine configured: {exc}") from exc
            try:
                with translate_errors("connecting to the Docker engine"):
                    await client.version()
            except BaseException:
                await client.close()
                raise
            self._client = client
        return self

    async def version(self) -> dict[str, Any]:
        with translate_errors("docker version"):
            result: dict[str, Any] = await self.client.version()
        return result

    async def request_json(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        action: str = "",
    ) -> Any:
        """One raw Engine API call returning its decoded JSON (for endpoints aiodocker lacks)."""
        with translate_errors(action or f"{method} {path}"):
            return await self.client._query_json(path, method, params=dict(params or {}), data=body)

    async def post_stream(
        self,
        path: str,
        *,
        params: Mapping[str, Any],
        body: AsyncIterable[bytes],
        content_type: str = "application/x-tar",
        action: str = "",
    ) -> list[dict[str, Any]]:
        """POST a streamed body and collect the JSON progress messages; raise on an error."""
        what = action or f"POST {path}"
        lines: list[str] = []
        await self.post_lines(path, params=params, body=body, on_line=lines.append, action=what,
                              content_type=content_type)  # fmt: skip
        messages = [json.loads(line) for line in lines]
        for message in messages:
            if "error" in message or "errorDetail" in message:
                detail = message.get("errorDetail", {}).get("message") or message.get("error")
                raise ImageError(f"{what} failed: {detail}")
        return messages

    async def post_lines(
        self,
        path: str,
        *,
        params: Mapping[str, Any],
        body: Any,
        on_line: Callable[[str], None],
        action: str,
        image: str | None = None,
        content_type: str = "application/x-tar",
    ) -> None:
        """POST a (streamed) body and hand each non-empty line of the reply to ``on_line`` as
        it arrives (a build's log)."""
        with translate_errors(action, image=image):
            async with self.client._query(
                path,
                "POST",
                params=dict(params),
                data=body,
                headers={"Content-Type": content_type},
                timeout=aiohttp.ClientTimeout(),
                chunked=True,
            ) as response:
                async for raw in response.content:
                    if line := raw.decode("utf-8", "replace").strip():
                        on_line(line)

    async def export_container(
        self, container_id: str, write: Callable[[bytes], Awaitable[None]]
    ) -> None:
        """Stream the container's filesystem as a tar (``docker export``) into ``write``."""
        with translate_errors("exporting container", container_id=container_id):
            async with self.client._query(f"containers/{container_id}/export") as response:
                async for chunk in response.content.iter_chunked(1 << 20):
                    await write(chunk)

    async def create_container(
        self, config: Mapping[str, Any], *, name: str | None = None, action: str, image: str
    ) -> str:
        """Create (not start) a container from ``config``; its id. ``action`` words an error."""
        with translate_errors(action, image=image):
            raw = await self.client.containers.create(dict(config), name=name)
        return str(raw.id)

    async def start_container(self, container_id: str) -> None:
        with translate_errors("starting container", container_id=container_id):
            await self._container(container_id).start()

    async def wait_container(self, container_id: str, *, action: str) -> int | None:
        """Wait for the container to exit; its exit status (``None`` when not reported)."""
        with translate_errors(action, container_id=container_id):
            result = await self._container(container_id).wait()
        code = result.get("StatusCode")
        return int(code) if isinstance(code, int) else None

    async def container_logs(self, container_id: str, *, tail: int, action: str) -> str:
        """The last ``tail`` lines the container wrote (stdout and stderr)."""
        with translate_errors(action, container_id=container_id):
            lines = await self._container(container_id).log(stdout=True, stderr=True, tail=tail)
        return "".join(lines)

    async def inspect_container(self, container_id: str) -> dict[str, Any]:
        with translate_errors("inspecting container", container_id=container_id):
            data: dict[str, Any] = await self._container(container_id).show()
        return data

    async def open_exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        stdin: bool = False,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecStream:
        """Start an exec in the container with its stream attached (the caller closes it)."""
        with translate_errors(f"exec {argv[0]!r}", container_id=container_id):
            execution = await self._container(container_id).exec(
                list(argv), stdin=stdin, environment=dict(env or {}), workdir=workdir,
                user=user or "",
            )  # fmt: skip
            stream = execution.start()
            await stream.__aenter__()
        return ExecStream(execution, stream, container_id)

    async def put_archive(self, container_id: str, directory: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into ``directory`` of the container (which must exist)."""
        with translate_errors(f"copying files into {directory!r}", container_id=container_id):
            await self._container(container_id).put_archive(directory, tar_bytes)  # type: ignore[no-untyped-call]

    async def get_archive(self, container_id: str, path: str) -> tarfile.TarFile:
        """A path of the container as an in-memory tar; a missing one is ``ContainerError``
        with ``status`` 404."""
        with translate_errors(f"reading {path!r}", container_id=container_id):
            tar: tarfile.TarFile = await self._container(container_id).get_archive(path)
        return tar

    async def commit_container(
        self, container_id: str, repo: str, tag: str, *, changes: Sequence[str]
    ) -> str:
        """Commit the container's filesystem as ``repo:tag``; the image id."""
        with translate_errors(f"committing to {repo}:{tag}", container_id=container_id):
            result = await self._container(container_id).commit(
                repository=repo, tag=tag, changes=list(changes)
            )
        return str(result["Id"])

    def _container(self, container_id: str) -> DockerContainer:
        return self.client.containers.container(container_id)

    async def remove_image(self, ref: str) -> bool:
        """Force-remove an image by name or id; ``False`` when it was already gone."""
        try:
            with translate_errors(f"removing image {ref!r}"):
                await self.client.images.delete(ref, force=True)
        except ContainerError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_containers(self, labels: Mapping[str, str | None]) -> list[dict[str, Any]]:
        """All containers (running or not) carrying ``labels`` (``None`` value: any value)."""
        wanted = [key if value is None else f"{key}={value}" for key, value in labels.items()]
        params = {"all": "true", "filters": json.dumps({"label": wanted})}
        result: list[dict[str, Any]] = await self.request_json(
            "GET", "containers/json", params=params, action="listing containers"
        )
        return result

    async def own_containers(self) -> list[dict[str, Any]]:
        """Containers created by this process (through any engine)."""
        return await self.list_containers(current_owner().labels)

    async def remove_container(self, container_id: str) -> bool:
        """Force-remove a container with its anonymous volumes; ``False`` if it was already gone."""
        try:
            with translate_errors("removing container", container_id=container_id):
                await self._container(container_id).delete(force=True, v=True)
        except ContainerError as exc:
            if exc.status == 404:
                return False
            if exc.status == 409 and "already in progress" in exc.message:
                return True
            raise
        return True

    async def inspect_image(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect data, or ``None`` when no image has that name or id."""
        try:
            with translate_errors(f"inspecting image {ref!r}", image=ref):
                data: dict[str, Any] = await self.client.images.inspect(ref)
        except ImageError:
            return None
        return data

    async def tag_image(self, ref: str, repo_tag: str) -> None:
        repo, tag = split_image_ref(repo_tag)
        with translate_errors(f"tagging {ref!r} as {repo_tag!r}", image=ref):
            await self.client.images.tag(ref, repo, tag=tag)

    async def disconnect(self) -> None:
        """Close the client but stay usable: the next ``connect`` opens a new one (for an
        owner with nothing running through it, so no connection outlives its event loop)."""
        async with self._lock:
            client, self._client = self._client, None
        await _close_client(client)

    async def aclose(self) -> None:
        """Close the client (idempotent); containers are not touched."""
        if self._closed:
            return
        self._closed = True
        client, self._client = self._client, None
        await _close_client(client)

    async def __aenter__(self) -> DockerEngine:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class ExecStream:
    """One exec's attached stream: a shell's channel (a broken stream is ``ConnectionError``,
    an exit status that cannot be read is ``None``) or a command's output (``read``,
    ``exit_status``: the client's errors mapped as ``translate_errors`` does)."""

    __slots__ = ("_container_id", "_exec", "_stream")

    def __init__(self, execution: Exec, stream: Stream, container_id: str) -> None:
        self._exec, self._stream, self._container_id = execution, stream, container_id

    async def write_in(self, data: bytes) -> None:
        try:
            await self._stream.write_in(data)
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"the exec stream broke: {exc}") from exc

    async def read_out(self) -> Message | None:
        try:
            return await self._stream.read_out()
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"the exec stream broke: {exc}") from exc

    async def read(self) -> tuple[bytes, bool] | None:
        """The next chunk and whether it is stdout; ``None`` at the end."""
        with translate_errors("reading an exec's output", container_id=self._container_id):
            message = await self._stream.read_out()
        return None if message is None else (message.data, message.stream == 1)

    async def exit_status(self) -> int | None:
        """The exec's exit status (``None`` while it runs)."""
        with translate_errors("inspecting exec", container_id=self._container_id):
            info = await self._exec.inspect()
        code = info.get("ExitCode")
        return code if isinstance(code, int) else None

    async def exit_code(self) -> int | None:
        try:
            return await self.exit_status()
        except (LlenvsError, OSError):
            return None

    async def close(self) -> None:
        await self._stream.close()
