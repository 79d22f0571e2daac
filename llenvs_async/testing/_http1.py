"""Minimal HTTP/1.1 framing for the test server: Content-Length bodies only."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

__all__ = ["BadRequest", "error_body", "read_request", "write_response"]

_MAX_BODY = 16 * 1024 * 1024


class BadRequest(Exception):
    """A request this minimal server cannot parse: the connection is dropped."""


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": HTTPStatus(status).phrase, "code": status}}


async def read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request (Content-Length bodies only); None at a clean end of stream."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise BadRequest(line)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if length > _MAX_BODY or "chunked" in headers.get("transfer-encoding", ""):
        raise BadRequest(headers)
    body = await reader.readexactly(length) if length else b""
    return parts[0], parts[1].split("?")[0], headers, body


async def write_response(
    writer: asyncio.StreamWriter, status: int, headers: Mapping[str, str], body: bytes
) -> None:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    all_headers = {"Content-Type": "application/json", **headers, "Content-Length": str(len(body))}
    lines += [f"{k}: {v}" for k, v in all_headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()
