"""A PEP 503 package index on 127.0.0.1 serving a directory of wheels, for builds that
must not leave loopback (``--provision-index-url``)."""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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


class _Handler(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        self.requests.append(self.path)


@contextmanager
def serve_index(root: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``root`` on 127.0.0.1 (a free port) while the block runs: the ``/simple`` URL
    and the list of request paths it answered; the server is shut down on exit."""
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="local-index", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
