"""Append-only JSONL files: one record per line, flushed; a truncated last line (a writer
killed mid-line) is repaired on append and skipped on read."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ..types import Trajectory
from ._decode import _read_trajectory
from ._encode import to_dict
from ._values import SerializationError, _encode_value


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


class JsonlWriter:
    """Appends one JSON record per line to ``path``, flushing each line as it is written.

    Opening repairs a truncated last line left by a killed writer, so appending is safe.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        _repair_tail(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self.written = 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line and flush it to the OS (and disk with ``fsync``)."""
        line = _dumps(record) + "\n"
        try:
            self._file.write(line)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:  # a full disk, say: name the file (a torn line is cut on reopen)
            raise OSError(exc.errno, f"{exc.strerror}: writing {self.path}") from exc
        self.written += 1

    def write_trajectory(self, trajectory: Trajectory, **fields: Any) -> None:
        """Write ``{"trajectory": to_dict(trajectory), **fields}`` (fields are JSON values)."""
        record = {k: _encode_value(v, k) for k, v in fields.items()}
        record["trajectory"] = to_dict(trajectory)
        self.write(record)

    def close(self) -> None:
        try:
            self._file.close()  # flushes what a failed write left buffered
        except OSError as exc:
            raise OSError(exc.errno, f"{exc.strerror}: writing {self.path}") from exc

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _repair_tail(path: Path) -> None:
    """Cut an unterminated last line that is not valid JSON; terminate one that is."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        start, pos = 0, end
        while pos > 0:  # scan back, chunk by chunk, for the last newline
            size = min(1 << 16, pos)
            pos -= size
            f.seek(pos)
            cut = f.read(size).rfind(b"\n")
            if cut >= 0:
                start = pos + cut + 1
                break
        f.seek(start)
        try:
            json.loads(f.read())
        except ValueError:
            f.truncate(start)
        else:
            f.write(b"\n")


def _iter_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    # Bytes, decoded line by line: a writer killed mid-line may have cut a multi-byte
    # UTF-8 character, which must count as a truncated last line, not fail the file.
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError included
            if number == len(lines) and not complete:
                return  # a truncated last line: the writer was killed mid-write
            raise SerializationError(f"{path}:{number}: malformed JSON line ({exc})") from None
        if not isinstance(record, dict):
            raise SerializationError(f"{path}:{number}: expected a JSON object per line")
        yield number, record


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every record of a JSONL file, ignoring a truncated last
    line, for readers whose own errors name the line."""
    return _iter_lines(Path(path))


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a JSONL file, ignoring a truncated last line."""
    return [record for _, record in _iter_lines(Path(path))]


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """The ``trajectory`` of every record written by ``JsonlWriter.write_trajectory``."""
    source = Path(path)
    out: list[Trajectory] = []
    for number, record in _iter_lines(source):
        data = record.get("trajectory")
        if not isinstance(data, dict):
            raise SerializationError(f"{source}:{number}: record has no 'trajectory' object")
        out.append(_read_trajectory(data, f"{source}:{number}"))
    return out
