"""The viewer page: one HTML file with its CSS and JS inlined, data embedded or fetched."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

__all__ = ["render_page"]

_STATIC = files(__package__).joinpath("static")


def _asset(name: str) -> str:
    return _STATIC.joinpath(name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can form)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(document: Any = None, details: Any = None) -> str:
    """The page; with ``document`` (and ``details``) embedded it needs no server (``--html``),
    without them it fetches ``api/document`` and ``api/trajectory/ID`` from the one serving it."""
    html = _asset("index.html")
    for marker, text in (
        ("/*CSS*/", _asset("viewer.css")),
        ("/*JS*/", _asset("viewer.js")),
        ("/*DOCUMENT*/", _script_json(document)),
        ("/*DETAILS*/", _script_json(details)),
    ):
        html = html.replace(marker, text, 1)
    return html
