"""A vLLM server's weight swap over HTTP: its RL and dev endpoints (``VLLM_SERVER_DEV_MODE=1``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..errors import BackendError
from ._outcomes import http_failure

__all__ = ["ServerSwap"]

_SNIPPET = 500


class ServerSwap:
    """``SwapTarget`` over a vLLM server's endpoints: ``/pause?mode=...``, ``/collective_rpc``
    ``reload_weights(weights_path=DIR)`` (its kwargs must be strings: a path is),
    ``/reset_prefix_cache?reset_running_requests=true``, ``/update_weight_version``, ``/resume``."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str]):
        parts = urlsplit(base_url)
        self._root = f"{parts.scheme}://{parts.netloc}"
        self._client = client
        self._headers = dict(headers)

    async def pause(self, mode: str) -> None:
        await self._post("/pause", params={"mode": mode, "clear_cache": "false"})

    async def reload(self, directory: str) -> None:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
        await self._post("/collective_rpc", body=rpc)

    async def reset_cache(self) -> None:
        await self._post("/reset_prefix_cache", params={"reset_running_requests": "true"})

    async def label(self, version: str) -> None:
        await self._post("/update_weight_version", body={"new_version": version})

    async def resume(self) -> None:
        await self._post("/resume")

    async def _post(
        self, path: str, *, params: Mapping[str, str] | None = None, body: Any = None
    ) -> None:
        url = f"{self._root}{path}"
        try:
            response = await self._client.post(url, params=params, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise http_failure("POST", url, exc) from exc
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
