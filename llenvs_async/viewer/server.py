"""Serves one viewer document on 127.0.0.1: the page, the run list and values, trajectories.

The stdlib ``http.server`` (threaded): a read-only local page needs neither an event loop
nor a dependency the core install lacks (starlette/uvicorn are dev extras only).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .page import render_page

__all__ = ["ViewerServer", "serving"]

HOST = "127.0.0.1"


class ViewerServer(ThreadingHTTPServer):
    """The page at ``/``, ``/api/document`` and ``/api/trajectory/ID`` as JSON."""

    daemon_threads = True

    def __init__(self, document: Any, details: Sequence[Any], port: int = 0) -> None:
        self.document = json.dumps(document).encode()
        self.details = details
        self.page = render_page().encode()
        super().__init__((HOST, port), _Handler)
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"

    def close(self) -> None:
        """Stop serving (when running) and release the port; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.server_close()


@contextmanager
def serving(document: Any, details: Sequence[Any], port: int = 0) -> Iterator[ViewerServer]:
    """A server answering from a background thread; stopped and closed on exit."""
    server = ViewerServer(document, details, port)
    thread = threading.Thread(target=server.serve_forever, name="llenvs-view", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.close()


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", self.server.page)
        elif path == "/api/document":
            self._send(200, "application/json", self.server.document)
        elif path.startswith("/api/trajectory/") and path.rsplit("/", 1)[1].isdigit():
            index = int(path.rsplit("/", 1)[1])
            if index < len(self.server.details):
                body = json.dumps(self.server.details[index]).encode()
                self._send(200, "application/json", body)
            else:
                self._send(404, "text/plain", b"no such trajectory")
        else:
            self._send(404, "text/plain", b"not found")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the terminal shows the URL, not every request."""
