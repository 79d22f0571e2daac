"""``environment/docker-compose.yaml`` parsed into the subset llenvs-async runs.

Service ``main`` is the agent's container (built from ``environment/Dockerfile`` as
usual); every other service is a sidecar. The daemon here has no bridge network, so
services run pod-style: each sidecar joins the main container's network namespace and
every service name resolves to ``127.0.0.1`` (see ``sidecars.py``). Supported keys:

- top level: ``services`` (required), ``version`` and ``name`` (ignored);
- ``main``: ``build`` (only ``.`` / ``environment/Dockerfile``), ``environment``,
  ``depends_on``, ``expose``/``ports`` (no-ops: every port is on localhost);
- sidecars: ``image`` or ``build`` (``context``, ``dockerfile``), ``command``,
  ``entrypoint``, ``environment``, ``working_dir``, ``user``, ``healthcheck`` (``test``,
  ``interval``, ``timeout``, ``retries``, ``start_period``, ``disable``), ``depends_on``
  (a list, or conditions ``service_started`` / ``service_healthy`` /
  ``service_completed_successfully``), ``expose``/``ports``.

Anything else (volumes, networks, privileges, ...) is a ``TaskLoadError`` naming the file,
the field and the value: a refusal rather than a silently different environment.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from ....errors import TaskLoadError

__all__ = [
    "MAIN_SERVICE",
    "ComposeService",
    "ComposeSpec",
    "HealthCheck",
    "load_compose",
    "parse_compose",
    "parse_duration",
]

MAIN_SERVICE = "main"
_TOP_KEYS = frozenset({"services", "version", "name"})
_MAIN_KEYS = frozenset({"build", "environment", "depends_on", "expose", "ports"})
_SIDECAR_KEYS = frozenset(
    {"image", "build", "command", "entrypoint", "environment", "working_dir", "user",
     "healthcheck", "depends_on", "expose", "ports"}
)  # fmt: skip
_HEALTH_KEYS = frozenset({"test", "interval", "timeout", "retries", "start_period", "disable"})
_CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
_SERVICE_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_SEC = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthCheck:
    """A sidecar's readiness probe: ``argv`` runs in the sidecar (``CMD-SHELL`` forms
    become ``/bin/sh -c``), every ``interval_sec`` after ``start_period_sec``, until it
    exits 0; ``retries`` consecutive failures make the sidecar unhealthy."""

    argv: tuple[str, ...]
    interval_sec: float = 30.0
    timeout_sec: float = 30.0
    retries: int = 3
    start_period_sec: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ComposeService:
    """One service of the compose file (``main`` or a sidecar)."""

    name: str
    image: str | None = None
    build_context: Path | None = None
    dockerfile: str = "Dockerfile"
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    environment: Mapping[str, str] = field(default_factory=_frozen)
    working_dir: str | None = None
    user: str | None = None
    healthcheck: HealthCheck | None = None
    depends_on: Mapping[str, str] = field(default_factory=_frozen)
    """``service -> condition`` (``service_started`` for the list form)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ComposeSpec:
    """A parsed compose file: its path, the main service and the sidecars in start order
    (every sidecar after the sidecars it depends on)."""

    path: Path
    main: ComposeService
    sidecars: tuple[ComposeService, ...]

    @property
    def service_names(self) -> tuple[str, ...]:
        return (self.main.name, *(s.name for s in self.sidecars))


def parse_duration(value: object, *, what: str, path: str) -> float:
    """A compose duration (``"1m30s"``, ``"500ms"``, or a number of seconds) in seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    text = value.strip() if isinstance(value, str) else ""
    parts = _DURATION_PART_RE.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise TaskLoadError(
            "must be a duration such as '10s', '500ms' or '1m30s'",
            path=path,
            field=what,
            value=value,
        )
    return sum(float(n) * _UNIT_SEC[u] for n, u in parts)


class _Reader:
    """Typed reads from one service mapping, raising ``TaskLoadError`` on the dotted field."""

    def __init__(self, data: Mapping[str, Any], prefix: str, path: str) -> None:
        self.data, self.prefix, self.path = data, prefix, path

    def error(self, key: str, message: str, value: Any = None) -> TaskLoadError:
        shown = self.data.get(key) if value is None else value
        return TaskLoadError(message, path=self.path, field=f"{self.prefix}{key}", value=shown)

    def only(self, allowed: frozenset[str], what: str) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(
                    str(key),
                    f"is not supported for {what} by llenvs-async (supported: "
                    f"{', '.join(sorted(allowed))})",
                )

    def string(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, str):
            raise self.error(key, "must be a string")
        return value

    def argv(self, key: str) -> tuple[str, ...] | None:
        """A command as a list, or a string split like a shell would (compose's rule)."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise self.error(key, f"cannot be split into words: {exc}") from None
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            return tuple(str(v) for v in value)
        raise self.error(key, "must be a string or a list of strings")

    def environment(self) -> Mapping[str, str]:
        value = self.data.get("environment", {})
        if isinstance(value, list):
            pairs = {}
            for item in value:
                if not isinstance(item, str) or "=" not in item:
                    raise self.error("environment", "list items must be 'KEY=value'", item)
                key, _, val = item.partition("=")
                pairs[key] = val
            return _frozen(pairs)
        if isinstance(value, dict) and all(
            isinstance(v, str | int | float | bool) for v in value.values()
        ):
            return _frozen({str(k): _scalar(v) for k, v in value.items()})
        raise self.error("environment", "must be a mapping or a list of 'KEY=value'")

    def depends_on(self, services: Mapping[str, Any]) -> Mapping[str, str]:
        value = self.data.get("depends_on", [])
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            deps = dict.fromkeys(value, "service_started")
        elif isinstance(value, dict):
            deps = {}
            for name, cond in value.items():
                condition = (
                    cond.get("condition", "service_started") if isinstance(cond, dict) else None
                )
                if condition not in _CONDITIONS:
                    raise self.error(
                        f"depends_on.{name}",
                        f"condition must be one of {', '.join(_CONDITIONS)}",
                        cond,
                    )
                deps[str(name)] = condition
        else:
            raise self.error("depends_on", "must be a list of services or a mapping")
        for name in deps:
            if name not in services:
                raise self.error(
                    "depends_on", f"names service {name!r}, which the file lacks", name
                )
        return _frozen(deps)


def _scalar(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _healthcheck(reader: _Reader) -> HealthCheck | None:
    raw = reader.data.get("healthcheck")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise reader.error("healthcheck", "must be a mapping")
    sub = _Reader(raw, f"{reader.prefix}healthcheck.", reader.path)
    sub.only(_HEALTH_KEYS, "a healthcheck")
    if raw.get("disable") is True:
        return None
    test = raw.get("test")
    if isinstance(test, str):
        argv: tuple[str, ...] = ("/bin/sh", "-c", test)
    elif isinstance(test, list) and test and all(isinstance(t, str) for t in test):
        kind, rest = test[0], tuple(test[1:])
        if kind == "NONE":
            return None
        if kind == "CMD" and rest:
            argv = rest
        elif kind == "CMD-SHELL" and len(rest) == 1:
            argv = ("/bin/sh", "-c", rest[0])
        else:
            raise sub.error("test", "must be ['CMD', ...], ['CMD-SHELL', 'cmd'] or a string")
    else:
        raise sub.error("test", "is required: ['CMD', ...], ['CMD-SHELL', 'cmd'] or a string", test)
    retries = raw.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise sub.error("retries", "must be an integer >= 1")

    def seconds(key: str, default: float) -> float:
        if key not in raw:
            return default
        return parse_duration(raw[key], what=f"{sub.prefix}{key}", path=reader.path)

    return HealthCheck(
        argv=argv,
        interval_sec=seconds("interval", 30.0) or 30.0,
        timeout_sec=seconds("timeout", 30.0) or 30.0,
        retries=retries,
        start_period_sec=seconds("start_period", 0.0),
    )


def _build(reader: _Reader, base: Path) -> tuple[Path | None, str]:
    raw = reader.data.get("build")
    if raw is None:
        return None, "Dockerfile"
    if isinstance(raw, str):
        context, dockerfile = raw, "Dockerfile"
    elif isinstance(raw, dict):
        sub = _Reader(raw, f"{reader.prefix}build.", reader.path)
        sub.only(frozenset({"context", "dockerfile"}), "a build")
        context = sub.string("context") or "."
        dockerfile = sub.string("dockerfile") or "Dockerfile"
    else:
        raise reader.error("build", "must be a context path or {context, dockerfile}")
    root = (base / context).resolve()
    if not root.is_relative_to(base.resolve()) or not (root / dockerfile).is_file():
        raise reader.error(
            "build", f"must name a Dockerfile inside {base} (no {context}/{dockerfile} there)"
        )
    return root, dockerfile


def _service(name: str, data: Any, services: Mapping[str, Any], path: Path) -> ComposeService:
    where = str(path)
    if not _SERVICE_NAME_RE.match(name):
        raise TaskLoadError("is not a valid service name", path=where, field="services", value=name)
    if not isinstance(data, dict):
        raise TaskLoadError("must be a mapping", path=where, field=f"services.{name}", value=data)
    reader = _Reader(data, f"services.{name}.", where)
    is_main = name == MAIN_SERVICE
    reader.only(
        _MAIN_KEYS if is_main else _SIDECAR_KEYS, "the main service" if is_main else "a sidecar"
    )
    context, dockerfile = _build(reader, path.parent)
    image = None if is_main else reader.string("image")
    if is_main:
        if context is not None and (context != path.parent.resolve() or dockerfile != "Dockerfile"):
            raise reader.error("build", "of the main service must be '.' (environment/Dockerfile)")
    elif (image is None) == (context is None):
        raise reader.error(
            "image", "a sidecar needs exactly one of image or build", data.get("image")
        )
    return ComposeService(
        name=name,
        image=image,
        build_context=context,
        dockerfile=dockerfile,
        command=reader.argv("command"),
        entrypoint=reader.argv("entrypoint"),
        environment=reader.environment(),
        working_dir=reader.string("working_dir"),
        user=None if data.get("user") is None else str(data["user"]),
        healthcheck=None if is_main else _healthcheck(reader),
        depends_on=reader.depends_on(services),
    )


def _start_order(sidecars: dict[str, ComposeService], path: str) -> tuple[ComposeService, ...]:
    order: list[ComposeService] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = " -> ".join((*chain, name))
            raise TaskLoadError(
                "has a depends_on cycle", path=path, field="depends_on", value=cycle
            )
        state[name] = "visiting"
        for dep in sidecars[name].depends_on:
            if dep == MAIN_SERVICE:
                raise TaskLoadError(
                    "a sidecar cannot depend on main (main holds the network namespace "
                    "sidecars join, so it always starts first)",
                    path=path,
                    field=f"services.{name}.depends_on",
                    value=MAIN_SERVICE,
                )
            visit(dep, (*chain, name))
        state[name] = "done"
        order.append(sidecars[name])

    for name in sorted(sidecars):
        visit(name, ())
    return tuple(order)


def parse_compose(text: str, *, path: Path) -> ComposeSpec:
    """Parse the text of a compose file at ``path`` (relative builds resolve against it)."""
    where = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"is not valid YAML: {' '.join(str(exc).split())}", path=where) from exc
    if not isinstance(data, dict):
        raise TaskLoadError("must be a mapping with a 'services' key", path=where, value=data)
    for key in data:
        if key not in _TOP_KEYS:
            raise TaskLoadError(
                f"is not supported by llenvs-async (supported: {', '.join(sorted(_TOP_KEYS))})",
                path=where,
                field=str(key),
                value=data[key],
            )
    services = data.get("services")
    if not isinstance(services, dict) or MAIN_SERVICE not in services:
        raise TaskLoadError(
            "must define a 'main' service (the agent's container)",
            path=where,
            field="services",
            value=None if not isinstance(services, dict) else sorted(services),
        )
    parsed = {str(n): _service(str(n), d, services, path) for n, d in services.items()}
    main = parsed.pop(MAIN_SERVICE)
    return ComposeSpec(path=path, main=main, sidecars=_start_order(parsed, where))


def load_compose(path: Path) -> ComposeSpec:
    """Read and parse a compose file (``TaskLoadError`` naming it when unreadable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"cannot be read: {exc}", path=str(path)) from exc
    return parse_compose(text, path=path)
