"""Registry datasets: ``name@version`` through a registry.json and real git, cached offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import TaskCache, parse_registry, split_dataset_spec
from llenvs_async.errors import TaskLoadError

from .conftest import MakeRegistry

SPEC = {
    "1.0": [("csv-totals", "csv-totals"), ("log-errors", "log-errors")],
    "2.0": [
        ("log-errors", "log-errors"),
        ("zz-organize", "organize-files"),
        ("a-json", "json-config"),
    ],
}


async def test_registry_dataset_keeps_registry_order(
    tmp_path: Path, make_registry: MakeRegistry
) -> None:
    registry = make_registry(SPEC)
    cache = TaskCache(tmp_path / "cache", registry)
    v2 = await cache.load_dataset("examples@2.0")
    assert v2.spec == "examples@2.0"
    assert [name for _, name in v2.list_tasks()] == [
        "log-errors",  # no [task] table: the registry's name
        "llenvs-examples/organize-files",
        "llenvs-examples/json-config",
    ]
    v1 = await cache.load_dataset("examples@1.0")
    assert [t.short_name for t in v1.tasks] == ["csv-totals", "log-errors"]
    assert all(str(t.path).startswith(str(tmp_path / "cache")) for t in v1.tasks)


async def test_cached_tasks_load_without_the_git_remote(
    tmp_path: Path, make_registry: MakeRegistry
) -> None:
    registry = make_registry(SPEC)
    first = await TaskCache(tmp_path / "cache", registry).load_dataset("examples@1.0")
    shutil.rmtree(tmp_path / "tasks-repo")  # the "network" is gone
    shutil.rmtree(tmp_path / "cache" / "git")  # and so is the mirror
    again = await TaskCache(tmp_path / "cache", registry.as_uri()).load_dataset("examples@1.0")
    assert again.list_tasks() == first.list_tasks()
    assert [t.path for t in again.tasks] == [t.path for t in first.tasks]


async def test_unreachable_git_remote_is_a_task_load_error(
    tmp_path: Path, make_registry: MakeRegistry
) -> None:
    registry = make_registry(SPEC)
    shutil.rmtree(tmp_path / "tasks-repo")
    with pytest.raises(TaskLoadError, match=r"git .*fetch"):
        await TaskCache(tmp_path / "cache", registry).load_dataset("examples@1.0")


async def test_unknown_dataset_or_version_is_named(
    tmp_path: Path, make_registry: MakeRegistry
) -> None:
    cache = TaskCache(tmp_path / "cache", make_registry(SPEC))
    with pytest.raises(TaskLoadError, match="no dataset 'nope'"):
        await cache.load_dataset("nope@1.0")
    with pytest.raises(TaskLoadError, match=r"no version '3.0'.*\['1.0', '2.0'\]"):
        await cache.load_dataset("examples@3.0")
    with pytest.raises(TaskLoadError, match="several versions"):
        await cache.load_dataset("examples")


async def test_missing_task_folder_at_commit_is_named(
    tmp_path: Path, make_registry: MakeRegistry
) -> None:
    registry = make_registry(SPEC)
    data = json.loads(registry.read_text())
    data[0]["tasks"][0]["path"] = "tasks/not-there"
    registry.write_text(json.dumps(data))
    with pytest.raises(TaskLoadError) as info:
        await TaskCache(tmp_path / "cache", registry).load_dataset("examples@1.0")
    assert info.value.value == "tasks/not-there"


def test_dataset_spec_parsing() -> None:
    assert split_dataset_spec("terminal-bench@2.0") == ("terminal-bench", "2.0")
    assert split_dataset_spec("terminal-bench") == ("terminal-bench", None)
    for bad in ("@2.0", "tb@", ""):
        with pytest.raises(ValueError, match="name@version"):
            split_dataset_spec(bad)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{}", None),
        ("[1]", "[0]"),
        ('[{"version": "1", "tasks": []}]', "[0].name"),
        ('[{"name": "x", "tasks": []}]', "[0].version"),
        ('[{"name": "x", "version": "1", "tasks": {}}]', "[0].tasks"),
        (
            '[{"name": "x", "version": "1", "tasks": [{"name": "t", "git_url": "u"}]}]',
            "[0].tasks[0].git_commit_id",
        ),
        (
            '[{"name": "x", "version": "1", "tasks": [{"name": "t", "git_url": "u", '
            '"git_commit_id": "c", "path": "../up"}]}]',
            "[0].tasks[0].path",
        ),
    ],
)
def test_malformed_registry_is_named(text: str, field: str | None) -> None:
    with pytest.raises(TaskLoadError) as info:
        parse_registry(text, source="registry.json")
    assert info.value.path == "registry.json"
    assert info.value.field == field
