"""``[[verifier.collect]]`` hooks and ``artifacts`` of compose sidecars: run in / copied from
the named sidecar container; a service the task does not have is a load-time error."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import load_task
from llenvs_async.cli import main
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import TaskLoadError

from .conftest import harbor_containers

REAL = Path(__file__).resolve().parent / "tasks_real" / "compose-sidecar"
# The kv sidecar dumps its own store (what the agent PUT) for the verifier's record.
_DUMP = (
    'python3 -c \\"import urllib.request as u; '
    "print(u.urlopen('http://localhost:8765/k').read().decode())\\\" > /tmp/kv-dump.txt"
)


def _task(tmp_path: Path, *, hook_service: str = "kv", artifact_service: str = "kv") -> Path:
    root = tmp_path / "compose-sidecar"
    shutil.copytree(REAL, root)
    toml = root / "task.toml"
    text = toml.read_text().replace(
        'schema_version = "1.4"\n',
        'schema_version = "1.4"\nartifacts = [{ source = "/tmp/kv-dump.txt", '
        f'destination = "kv/dump.txt", service = "{artifact_service}" }}]\n',
    )
    text += f'\n[[verifier.collect]]\nservice = "{hook_service}"\ncommand = "{_DUMP}"\n'
    toml.write_text(text)
    return root


@pytest.mark.parametrize(
    ("hook", "artifact", "field"),
    [("db", "kv", "verifier.collect[0].service"), ("kv", "cache", "artifacts[0].service")],
)
def test_an_unknown_service_is_a_load_error_naming_field_and_value(
    tmp_path: Path, hook: str, artifact: str, field: str
) -> None:
    with pytest.raises(TaskLoadError) as caught:
        load_task(_task(tmp_path, hook_service=hook, artifact_service=artifact))
    message = str(caught.value)
    assert f"field {field!r}" in message, message
    assert repr(hook if "collect" in field else artifact) in message
    assert "services: main, kv" in message


@pytest.mark.docker
async def test_hooks_run_in_and_artifacts_come_from_the_named_sidecar(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    out, kept = tmp_path / "c.jsonl", tmp_path / "kept"
    args = ["run", str(_task(tmp_path)), "-o", str(out), "-q", "--artifacts-dir", str(kept)]
    assert await asyncio.to_thread(main, args) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    trajectory = record["trajectory"]
    assert trajectory["error"] is None
    final = trajectory["transitions"][-1]
    assert final["reward"] == 1.0
    (hook,) = final["info"]["collect_hooks"]
    assert (hook["service"], hook["exit_code"]) == ("kv", 0)
    by_source = {a["source"]: a for a in final["info"]["artifacts"]}
    assert by_source["/tmp/kv-dump.txt"]["service"] == "kv"
    assert by_source["/tmp/kv-dump.txt"]["files"] == 1
    dump = Path(final["info"]["artifacts_dir"]) / "kv" / "dump.txt"
    assert dump.read_text().strip() == "v"  # the value the oracle PUT into the sidecar
    assert await harbor_containers(docker_engine) == []
