"""The viewer page: one HTML file with its CSS and JS inlined, data embedded or fetched."""

from __future__ import annotations

import json
import re
from importlib.resources import files
from typing import Any

__all__ = ["render_page"]

_STATIC = files(__package__).joinpath("static")
_MARKERS = re.compile(r"/\*(?:CSS|JS|DOCUMENT|DETAILS)\*/")


def _asset(name: str) -> str:
    return _STATIC.joinpath(name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can form)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(document: Any = None, details: Any = None) -> str:
    """The page; with ``document`` (and ``details``) embedded it needs no server (``--html``),
    without them it fetches ``api/document`` and ``api/trajectory/ID`` from the one serving it."""
    parts = {
        "/*CSS*/": _asset("viewer.css"),
        "/*JS*/": _asset("viewer.js"),
        "/*DOCUMENT*/": _script_json(document),
        "/*DETAILS*/": _script_json(details),
    }
    # One pass over the template: a marker inside filled-in data is never filled again.
    return _MARKERS.sub(lambda m: parts[m.group(0)], _asset("index.html"), count=len(parts))
