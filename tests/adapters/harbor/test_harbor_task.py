"""Task loading: the example tasks parse; every malformed piece names its file, field and value."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import (
    HarborDataset,
    NetworkMode,
    load_local_dataset,
    load_task,
    parse_task_config,
)
from llenvs_async.errors import TaskLoadError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
EXAMPLE_NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "task.toml").is_file())


def test_examples_form_a_dataset_sorted_by_directory_name() -> None:
    dataset = load_local_dataset(EXAMPLES)
    assert len(dataset) >= 6
    assert [t.path.name for t in dataset.tasks] == EXAMPLE_NAMES
    assert dataset.list_tasks() == [(i, t.name) for i, t in enumerate(dataset.tasks)]
    for task in dataset.tasks:
        assert task.dockerfile is not None
        assert task.dockerfile.read_text().startswith("FROM debian:bookworm-slim")
        assert task.config.environment.network_mode is NetworkMode.NO_NETWORK
        assert task.solution_commands(), task.name


def test_schema_14_task_is_parsed_into_typed_config() -> None:
    task = load_task(EXAMPLES / "build-release")
    assert task.name == "llenvs-examples/build-release"
    assert task.short_name == "build-release"
    cfg = task.config
    assert cfg.schema_version == "1.4"
    assert cfg.agent.timeout_sec == 180.0
    assert cfg.verifier.timeout_sec == 60.0
    assert cfg.environment.workdir == "/app"
    assert cfg.environment.memory_mb == 512
    assert cfg.metadata["category"] == "system-administration"
    assert "Build a release" in task.instruction
    assert task.solution_commands()[0] == "cd /app/project"
    assert len(task.solution_commands()) >= 3


def test_legacy_task_toml_keys_are_folded_in() -> None:
    task = load_task(EXAMPLES / "log-errors")
    assert task.name == "log-errors"  # no [task] table: the directory name
    env = task.config.environment
    assert task.config.schema_version == "1.0"
    assert env.network_mode is NetworkMode.NO_NETWORK  # allow_internet = false
    assert (env.memory_mb, env.storage_mb) == (512, 1024)  # memory = "512M", storage = "1G"


def test_defaults_follow_harbor() -> None:
    cfg = parse_task_config("")
    assert cfg.agent.timeout_sec is None
    assert cfg.verifier.timeout_sec == 600.0
    assert cfg.environment.network_mode is NetworkMode.PUBLIC
    assert (cfg.environment.cpus, cfg.environment.memory_mb) == (1.0, 2048)


def test_config_values_are_frozen() -> None:
    cfg = parse_task_config('[verifier]\nenv = { A = "1" }\n')
    with pytest.raises(TypeError):
        cfg.verifier.env["A"] = "2"  # type: ignore[index]
    with pytest.raises(AttributeError):
        cfg.agent.timeout_sec = 3.0  # type: ignore[misc]


# (task.toml text, field named in the error, bad value named in the error)
MALFORMED_TOML: list[tuple[str, str | None, object]] = [
    ("[agent\ntimeout_sec = 1", None, None),  # TOML syntax error
    ("[agent]\ntimeout_sec = 'fast'", "agent.timeout_sec", "fast"),
    ("[agent]\ntimeout_sec = -5", "agent.timeout_sec", -5),
    ("[agent]\ntimeout_sec = true", "agent.timeout_sec", True),
    ("[verifier]\ntimeout_sec = nan", "verifier.timeout_sec", "nan"),
    ("[verifier]\nenv = { A = 1 }", "verifier.env", {"A": 1}),
    ("agent = 3", "agent", 3),
    ("[task]\ndescription = 'no name'", "task.name", None),
    ("[task]\nname = 'bad name!'", "task.name", "bad name!"),
    ("[task]\nname = 'org/x'\nauthors = ['me']", "task.authors", ["me"]),
    ("[task]\nname = 'org/x'\nkeywords = 'a,b'", "task.keywords", "a,b"),
    ("[environment]\nmemory = 'lots'", "environment.memory", "lots"),
    ("[environment]\nstorage = 10", "environment.storage", 10),
    ("[environment]\nmemory = '1G'\nmemory_mb = 512", "environment.memory", "1G"),
    ("[environment]\nmemory_mb = 0", "environment.memory_mb", 0),
    ("[environment]\nmemory_mb = 1.5", "environment.memory_mb", 1.5),
    ("[environment]\ncpus = 0", "environment.cpus", 0),
    ("[environment]\ngpus = -1", "environment.gpus", -1),
    ("[environment]\nnetwork_mode = 'wifi'", "environment.network_mode", "wifi"),
    ("[environment]\nallow_internet = 'yes'", "environment.allow_internet", "yes"),
    (
        "[environment]\nnetwork_mode = 'public'\nallow_internet = false",
        "environment.allow_internet",
        False,
    ),
    (
        "[environment]\nnetwork_mode = 'no-network'\nallowed_hosts = ['pypi.org']",
        "environment.allowed_hosts",
        ["pypi.org"],
    ),
    ("[environment]\nworkdir = 'app'", "environment.workdir", "app"),
    ("[environment]\ndocker_image = 42", "environment.docker_image", 42),
    ("[environment]\nbuild_timeout_sec = '10m'", "environment.build_timeout_sec", "10m"),
    ("[metadata]\n[metadata.x]\ny = 1\n[[metadata]]", None, None),  # TOML redefinition
    ("metadata = [1, 2]", "metadata", [1, 2]),
    ("[agent]\nuser = 1.5", "agent.user", 1.5),
]


@pytest.mark.parametrize(("text", "field", "value"), MALFORMED_TOML)
def test_malformed_task_toml_names_the_problem(
    tmp_path: Path, text: str, field: str | None, value: object
) -> None:
    task_dir = tmp_path / "broken"
    shutil.copytree(EXAMPLES / "csv-totals", task_dir)
    (task_dir / "task.toml").write_text(text)
    with pytest.raises(TaskLoadError) as info:
        load_task(task_dir)
    err = info.value
    assert err.path == str(task_dir / "task.toml")
    assert err.field == field
    if isinstance(value, str) and value == "nan":
        assert str(err.value) == "nan"
    else:
        assert err.value == value
    assert str(task_dir / "task.toml") in str(err)
    if field is not None:
        assert repr(field) in str(err)


@pytest.mark.parametrize(
    ("remove", "expected_path", "field"),
    [
        ("task.toml", "task.toml", None),
        ("instruction.md", "instruction.md", None),
        ("tests/test.sh", "tests/test.sh", None),
        ("environment/Dockerfile", "environment/Dockerfile", "environment.docker_image"),
    ],
)
def test_missing_task_files_are_named(
    tmp_path: Path, remove: str, expected_path: str, field: str | None
) -> None:
    task_dir = tmp_path / "t"
    shutil.copytree(EXAMPLES / "csv-totals", task_dir)
    (task_dir / remove).unlink()
    with pytest.raises(TaskLoadError) as info:
        load_task(task_dir)
    assert info.value.path == str(task_dir / expected_path)
    assert info.value.field == field


def test_empty_instruction_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    task_dir = tmp_path / "t"
    shutil.copytree(EXAMPLES / "csv-totals", task_dir)
    (task_dir / "instruction.md").write_text("  \n")
    with pytest.raises(TaskLoadError, match="is empty"):
        load_task(task_dir)
    (task_dir / "instruction.md").write_bytes(b"\xff\xfe bad")
    with pytest.raises(TaskLoadError, match="UTF-8"):
        load_task(task_dir)


def test_prebuilt_image_without_dockerfile_is_accepted(tmp_path: Path) -> None:
    task_dir = tmp_path / "t"
    shutil.copytree(EXAMPLES / "csv-totals", task_dir)
    (task_dir / "environment" / "Dockerfile").unlink()
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(
        toml.replace("[environment]", '[environment]\ndocker_image = "llenvs/base:bookworm"')
    )
    task = load_task(task_dir)
    assert task.dockerfile is None
    assert task.config.environment.docker_image == "llenvs/base:bookworm"


def test_dataset_lookup_by_index_full_name_and_short_name() -> None:
    dataset = load_local_dataset(EXAMPLES)
    index, task = dataset.resolve("llenvs-examples/csv-totals")
    assert dataset.resolve("csv-totals") == (index, task)
    assert dataset.resolve(index) == (index, task)
    with pytest.raises(KeyError, match="no task named"):
        dataset.resolve("nope")
    with pytest.raises(IndexError):
        dataset.resolve(len(dataset))
    with pytest.raises(ValueError, match="needs a task index or name"):
        dataset.resolve(None)
    single = load_local_dataset(EXAMPLES / "csv-totals")
    assert single.resolve(None)[1].name == "llenvs-examples/csv-totals"


def test_dataset_refuses_duplicates_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(TaskLoadError, match="holds no tasks"):
        load_local_dataset(tmp_path)
    shutil.copytree(EXAMPLES / "csv-totals", tmp_path / "a")
    shutil.copytree(EXAMPLES / "csv-totals", tmp_path / "b")
    with pytest.raises(TaskLoadError, match="two tasks named"):
        load_local_dataset(tmp_path)
    task = load_task(tmp_path / "a")
    with pytest.raises(TaskLoadError):
        HarborDataset(name="x", version=None, source="x", tasks=())
    assert len(HarborDataset(name="x", version=None, source="x", tasks=(task,))) == 1


def test_broken_task_in_a_dataset_is_kept_apart_not_skipped(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "csv-totals", tmp_path / "a")
    shutil.copytree(EXAMPLES / "log-errors", tmp_path / "b")
    (tmp_path / "b" / "task.toml").write_text("[agent]\ntimeout_sec = 'x'\n")
    (tmp_path / "notes").mkdir()  # no task.toml: not a task, ignored
    dataset = load_local_dataset(tmp_path)
    assert [t.short_name for t in dataset.tasks] == ["csv-totals"]  # the sibling still loads
    assert list(dataset.unloadable) == ["b"]
    assert dataset.resolve("csv-totals")[0] == 0
    with pytest.raises(TaskLoadError) as info:
        dataset.resolve("b")  # asking for the broken one raises its own error
    assert info.value.field == "agent.timeout_sec"


def test_artifacts_are_parsed_strings_or_tables(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES / "csv-totals", tmp_path / "a")
    toml = tmp_path / "a" / "task.toml"
    extra = (
        'artifacts = ["/app/out", {source = "/app/logs/", destination = "l", exclude = ["*.tmp"]}]'
    )
    toml.write_text(extra + "\n" + toml.read_text())
    task = load_task(tmp_path / "a")
    assert task.config.ignored == ()
    first, second = task.config.artifacts
    assert (first.source, first.target, first.exclude) == ("/app/out", "out", ())
    assert (second.target, second.exclude) == ("l", ("*.tmp",))
