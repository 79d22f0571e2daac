"""A tiny in-memory key-value HTTP service: PUT /KEY stores the body, GET /KEY reads it."""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE: dict[str, bytes] = {}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        value = STORE.get(self.path.strip("/"), b"") if self.path != "/" else b"ok"
        self.send_response(200 if value else 404)
        self.end_headers()
        self.wfile.write(value)

    def do_PUT(self) -> None:
        STORE[self.path.strip("/")] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
