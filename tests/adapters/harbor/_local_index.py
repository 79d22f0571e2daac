"""Package servers on 127.0.0.1 for builds that must not leave loopback: a PEP 503 index
of wheels (``--provision-index-url``) and a flat apt repository of ``.deb`` files."""

from __future__ import annotations

import hashlib
import html
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("LLENVS_CACHE_DIR", Path.home() / ".cache" / "llenvs-async"))
WHEELS = _CACHE / "wheels" / "provision-test"
DEBS = _CACHE / "debs" / "apt-test"


def cached_packages(where: Path) -> Path:
    """``where``, once ``scripts/ensure-test-packages.sh`` filled it; else a skip (a
    failure with ``CI=true``: the test would otherwise need the internet)."""
    if not (where / ".complete").is_file():
        pytest.skip(f"no test packages at {where}: run scripts/ensure-test-packages.sh")
    return where


def _project(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def simple_tree(wheels: Path, root: Path) -> list[str]:
    """``root/simple/<project>/index.html`` linking each wheel in ``wheels`` (copied under
    ``root/files``); the projects it serves."""
    files = root / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[str]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        (files / wheel.name).write_bytes(wheel.read_bytes())
        projects.setdefault(_project(wheel.name), []).append(wheel.name)
    for project, names in projects.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{html.escape(n)}">{html.escape(n)}</a>\n' for n in names
        )
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return sorted(projects)


def apt_tree(debs: Path, root: Path) -> list[str]:
    """A flat apt repository (``deb [trusted=yes] URL ./``) in ``root``: each ``.deb`` in
    ``debs`` copied there and a ``Packages`` index of their control fields; their names."""
    root.mkdir(parents=True)
    stanzas, names = [], []
    for deb in sorted(debs.glob("*.deb")):
        data = deb.read_bytes()
        (root / deb.name).write_bytes(data)
        control = subprocess.run(
            ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
        ).stdout.rstrip("\n")
        digest = hashlib.sha256(data).hexdigest()
        stanzas.append(f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\nSHA256: {digest}\n")
        names.append(deb.name.split("_", 1)[0])
    (root / "Packages").write_text("\n".join(stanzas))
    return names


class _Handler(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        self.requests.append(self.path)


@contextmanager
def serve(root: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``root`` on 127.0.0.1 (a free port) while the block runs: its URL and the list
    of request paths it answered; the server is shut down on exit."""
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="local-index", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
