"""``HarborSettings``: how Harbor tasks are built and run, as one value. The adapter, the CLI and
the results files all use it, so each rule is checked once (here) and a run's settings
round-trip through JSON. An error names the field; the CLI words it with its flags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from ...docker.runtime import get_runtime, runtime_names
from ...errors import LlenvsError
from ...protocols import PROTOCOLS, AgentProtocol
from ...shell_task import DEFAULT_MAX_OBSERVATION_CHARS
from .episode.budget import DEFAULT_COMMAND_TIMEOUT_SEC

__all__ = ["HarborSettings", "HarborSettingsError"]

# Names results files written before HarborSettings used for its fields.
_OLD_NAMES = {
    "base_images": "base_image_aliases",
    "command_timeout": "command_timeout_sec",
    "observation_chars": "max_observation_chars",
}


class HarborSettingsError(LlenvsError, ValueError):
    """A setting's value breaks a rule. ``rule`` names fields as ``{field}`` placeholders, so a
    caller can word it with its own names for them (``wording``)."""

    def __init__(self, rule: str, *, field: str, value: object = None) -> None:
        self.rule, self.field, self.value = rule, field, value
        super().__init__(self.wording({}), field=field, value=value)

    def wording(self, names: Mapping[str, str]) -> str:
        """The rule with each field named as ``names`` says (default: its own name)."""
        return self.rule.format_map({f.name: names.get(f.name, f.name) for f in _FIELDS})


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborSettings:
    """How Harbor tasks are built and run.

    ``allow_network``: a task that asks for a network gets one (else none).
    ``base_image_aliases``: ``(pattern, image)`` pairs (``fnmatch`` patterns, e.g.
    ``"python:3.*"``) naming the local image a Dockerfile's ``FROM``/``COPY --from`` or a
    prebuilt ``docker_image`` means; unmapped names use built-in stand-ins. ``build_network``:
    builds use the host's network (separate from ``allow_network``); ``build_ca_bundle``: a
    host CA file trusted inside builds. ``provision_verifier``: a verifier's pinned downloads
    happen at build time, so it runs offline (needs ``build_network``), from
    ``provision_index_url`` when given. ``runtime``: ``runc`` (Docker containers) or
    ``gvisor`` (runsc sandboxes). ``warm_pool``: started containers kept per task image.
    ``artifacts_dir``: where each verified episode's artifacts are kept. ``action_format``,
    ``max_format_errors``, ``max_observation_chars``, ``system_prompt``: every environment's
    (``ShellTaskEnvironment``). ``command_timeout_sec``: each command's limit (``"task"``: the
    task's own). ``start_step``: the step of a multi-step task every rollout starts at (the
    CLI's ``--start-step``).
    """

    allow_network: bool = False
    base_image_aliases: tuple[tuple[str, str], ...] = ()
    build_network: bool = False
    build_ca_bundle: str | None = None
    provision_verifier: bool = False
    provision_index_url: str | None = None
    runtime: Literal["runc", "gvisor"] = "runc"
    warm_pool: int = 0
    artifacts_dir: str | None = None
    action_format: str | AgentProtocol = "text"
    max_format_errors: int | None = 3
    max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS
    system_prompt: str | None = None
    command_timeout_sec: float | Literal["task"] = DEFAULT_COMMAND_TIMEOUT_SEC
    start_step: str | None = None

    def __post_init__(self) -> None:
        for name in ("build_ca_bundle", "artifacts_dir"):  # a Path is taken as its text
            if isinstance(value := getattr(self, name), Path):
                object.__setattr__(self, name, str(value))
        pairs = self.base_image_aliases
        pairs = tuple(pairs.items()) if isinstance(pairs, Mapping) else tuple(pairs)
        if not all(isinstance(p, Sequence) and len(p) == 2 for p in pairs):
            raise HarborSettingsError(
                "{base_image_aliases} must be (pattern, image) pairs",
                field="base_image_aliases", value=self.base_image_aliases,
            )  # fmt: skip
        object.__setattr__(self, "base_image_aliases", tuple((str(a), str(b)) for a, b in pairs))
        if self.build_ca_bundle is not None:
            ca = Path(self.build_ca_bundle).expanduser()
            if not ca.is_file():
                raise HarborSettingsError(
                    f"{{build_ca_bundle}} {_v(self.build_ca_bundle)}: no such file",
                    field="build_ca_bundle", value=self.build_ca_bundle,
                )  # fmt: skip
            object.__setattr__(self, "build_ca_bundle", str(ca.resolve()))
        if self.provision_verifier and not self.build_network:
            raise HarborSettingsError(
                "{provision_verifier} fetches at build time: it needs {build_network}",
                field="provision_verifier", value=True,
            )  # fmt: skip
        if self.provision_index_url is not None and not self.provision_verifier:
            raise HarborSettingsError(
                "{provision_index_url} is the index of {provision_verifier}",
                field="provision_index_url", value=self.provision_index_url,
            )  # fmt: skip
        if self.runtime not in runtime_names():
            known = " or ".join(repr(n) for n in runtime_names())
            raise HarborSettingsError(
                f"{{runtime}} must be {_v(known)[1:-1]}, got {_v(self.runtime)}",
                field="runtime", value=self.runtime,
            )  # fmt: skip
        warm = self.warm_pool
        if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
            raise HarborSettingsError(f"{{warm_pool}} must be an int >= 0, got {_v(warm)}",
                                      field="warm_pool", value=warm)  # fmt: skip
        if warm and "warm_pool" not in get_runtime(self.runtime).capabilities:
            raise HarborSettingsError(
                f"{{warm_pool}} holds Docker containers, not boxes of runtime {_v(self.runtime)}: "
                f"use no warm pool with {{runtime}} {_v(self.runtime)}",
                field="warm_pool", value=warm,
            )  # fmt: skip
        self._check_paths_and_formats()

    def _check_paths_and_formats(self) -> None:
        if self.artifacts_dir is not None:
            where = Path(self.artifacts_dir).expanduser()
            if where.exists() and not where.is_dir():
                raise HarborSettingsError(
                    f"{{artifacts_dir}} {_v(self.artifacts_dir)} is not a directory",
                    field="artifacts_dir", value=self.artifacts_dir,
                )  # fmt: skip
            object.__setattr__(self, "artifacts_dir", str(where.resolve()))
        fmt = self.action_format
        if not isinstance(fmt, AgentProtocol) and fmt not in PROTOCOLS:
            raise HarborSettingsError(
                f"{{action_format}} must be one of {', '.join(PROTOCOLS)}, got {_v(fmt)}",
                field="action_format", value=fmt,
            )  # fmt: skip
        errors = self.max_format_errors
        if errors is not None and (isinstance(errors, bool) or errors < 1):
            raise HarborSettingsError(f"{{max_format_errors}} must be >= 1, got {_v(errors)}",
                                      field="max_format_errors", value=errors)  # fmt: skip
        chars = self.max_observation_chars
        if chars is not None and chars < 64:
            raise HarborSettingsError(
                f"{{max_observation_chars}} must be >= 64, got {_v(chars)}",
                field="max_observation_chars", value=chars,
            )  # fmt: skip
        timeout = self.command_timeout_sec
        if timeout != "task" and (isinstance(timeout, bool) or not timeout > 0):
            raise HarborSettingsError(
                f"{{command_timeout_sec}} must be > 0 seconds or 'task', got {_v(timeout)}",
                field="command_timeout_sec", value=timeout,
            )  # fmt: skip
        if self.start_step is not None and not self.start_step.strip():
            raise HarborSettingsError("{start_step} needs a step name", field="start_step",
                                      value=self.start_step)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values (a custom ``AgentProtocol`` has no JSON form)."""
        if not isinstance(self.action_format, str):
            raise HarborSettingsError(
                "{action_format} is a custom AgentProtocol, which has no JSON form",
                field="action_format", value=self.action_format,
            )  # fmt: skip
        data = asdict(self)
        data["base_image_aliases"] = [list(pair) for pair in self.base_image_aliases]
        return data

    @classmethod
    def from_json(cls, data: Any) -> HarborSettings:
        """Settings from ``to_json``'s form (and older results files' names); a field that is
        unknown or breaks a rule is a ``HarborSettingsError`` naming it."""
        if not isinstance(data, Mapping):
            raise HarborSettingsError(f"settings must be an object, got {_v(data)}",
                                      field="", value=data)  # fmt: skip
        values: dict[str, Any] = {_OLD_NAMES.get(str(k), str(k)): v for k, v in data.items()}
        if values.get("command_timeout_sec", "") is None:  # older files: None meant the default
            values.pop("command_timeout_sec")
        known = {f.name for f in _FIELDS}
        for name in values:
            if name not in known:
                raise HarborSettingsError(f"unknown setting {_v(name)}", field=name)
        try:
            return cls(**values)
        except TypeError as exc:  # a value of the wrong type, caught by a rule's comparison
            raise HarborSettingsError(
                f"settings {_v(dict(data))}: {_v(str(exc))[1:-1]}", field=""
            ) from None


_FIELDS = fields(HarborSettings)


def _v(value: object) -> str:
    """``repr(value)``, its braces kept literal in a rule."""
    return repr(value).replace("{", "{{").replace("}", "}}")
