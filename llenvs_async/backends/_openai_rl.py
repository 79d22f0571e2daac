"""A vLLM server's weight swap over HTTP: its RL and dev endpoints (``VLLM_SERVER_DEV_MODE=1``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..errors import BackendError

__all__ = ["reload_server_weights"]

_SNIPPET = 500


async def reload_server_weights(
    client: httpx.AsyncClient,
    base_url: str,
    headers: Mapping[str, str],
    directory: str,
    version: int,
    mode: str,
) -> None:
    """Pause (``mode``), ``reload_weights(weights_path=directory)`` through
    ``/collective_rpc`` (its kwargs must be strings: a path is), reset the prefix cache
    (preempting running requests), label the weights ``str(version)``, and resume (always)."""
    parts = urlsplit(base_url)
    root = f"{parts.scheme}://{parts.netloc}"

    async def post(path: str, *, params: Mapping[str, str] | None = None, body: Any = None) -> None:
        url = f"{root}{path}"
        try:
            response = await client.post(url, params=params, json=body, headers=dict(headers))
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {url} failed: {type(exc).__name__}: {exc}", url=url) from exc
        if response.status_code == 404:
            raise BackendError(
                f"POST {url}: HTTP 404: the server has no RL/dev endpoints (start vLLM with "
                "VLLM_SERVER_DEV_MODE=1)",
                status_code=404,
                url=url,
            )
        if response.status_code >= 300:
            text = " ".join(response.text.split())[:_SNIPPET]
            raise BackendError(
                f"POST {url} failed with HTTP {response.status_code}: {text!r}",
                status_code=response.status_code,
                url=url,
                body=response.text,
            )

    await post("/pause", params={"mode": mode, "clear_cache": "false"})
    try:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
        await post("/collective_rpc", body=rpc)
        await post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        await post("/update_weight_version", body={"new_version": str(version)})
    finally:
        await post("/resume")
