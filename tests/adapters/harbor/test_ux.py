"""What third-party tasks showed a new user stumbles on (issue 21, item 5), each fixed:
hints and short messages from failed builds, a "why 0" in the table, help text that
renders, a broken-only dataset that says why, and no unclosed connection at exit."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from llenvs_async.adapters.harbor import HarborAdapter
from llenvs_async.cli import app
from llenvs_async.cli._results import ResultRecord, summary_table, why_zero
from llenvs_async.cli._sources import SourceSpec
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import EnvError, ImageError
from llenvs_async.types import Action, Observation, State, Trajectory, Transition

from .conftest import EXAMPLES, harbor_containers

ROOT = Path(__file__).resolve().parents[3]
TOML = '[task]\nname = "t/{name}"\n[environment]\nnetwork_mode = "no-network"\n'


def _task(root: Path, name: str, dockerfile: str) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(TOML.format(name=name))
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return task


@pytest.mark.docker
async def test_an_untrusted_certificate_in_a_build_points_at_build_ca_bundle(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    failing = (  # what pip prints behind a TLS-intercepting proxy, offline and deterministic
        "FROM debian:bookworm-slim\nRUN echo 'Could not fetch URL https://pypi.org/simple/x/: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate "
        "in certificate chain' >&2; exit 1\n"
    )
    _task(tmp_path / "tasks", "cert", failing)
    async with (
        HarborAdapter(cache_dir=tmp_path / "c", engine=docker_engine, build_network=True) as ad,
        await ad.get_environment(tmp_path / "tasks") as env,
    ):
        with pytest.raises(ImageError) as info:
            await env.reset(0)
    assert "--build-ca-bundle" in str(info.value)
    assert "/etc/ssl/certs/ca-certificates.crt" in str(info.value)


@pytest.mark.docker
async def test_a_failed_build_message_fits_a_screen_without_ansi_and_keeps_the_tail(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    noisy = (  # pip-like output: colours, progress bars, very long lines, then the reason
        "FROM debian:bookworm-slim\n"
        "RUN for i in $(seq 1 200); do "
        "printf '\\033[31mERROR\\033[0m line %s %s\\n' $i $(printf 'x%.0s' $(seq 1 400)); "
        "printf '   \\342\\224\\201\\342\\224\\201 1.2/21.3 MB 12 MB/s eta 0:00:02\\n'; done; "
        "echo 'the tail that matters: No space left on device'; exit 3\n"
    )
    _task(tmp_path / "tasks", "noisy", noisy)
    async with (
        HarborAdapter(cache_dir=tmp_path / "c", engine=docker_engine) as adapter,
        await adapter.get_environment(tmp_path / "tasks") as env,
    ):
        with pytest.raises(ImageError) as info:
            await env.reset(0)
    message = str(info.value)
    assert "\x1b" not in message
    assert "MB/s" not in message.split("build log (last lines):")[1]  # progress bars dropped
    assert len(message.splitlines()) <= 25 and len(message) <= 3000, (len(message), message)
    assert all(len(line) <= 200 for line in message.splitlines()[1:])
    assert "the tail that matters: No space left on device" in message
    assert "returned a non-zero code: 3" in message


def _zero(output: str) -> Trajectory:
    state = State(observation=Observation(text="x"), task="t")
    final = Transition(
        state=state,
        action=Action(text="SUBMIT"),
        next_state=state,
        reward=0.0,
        info={"verifier_output": output},
    )
    return Trajectory(episode_id="e", initial_state=state, transitions=(final,))


def test_a_zero_without_an_error_says_why_in_the_table() -> None:
    pytest_output = (
        "collected 1 item\n../tests/test_outputs.py F [100%]\n"
        "=================================== FAILURES ===================================\n"
        "E       AssertionError: assert '' == '42'\n"
        "=========================== short test summary info ============================\n"
        "FAILED ../tests/test_outputs.py::test_answer_is_42 - AssertionError: assert '' == '42'\n"
        "============================== 1 failed in 0.02s ===============================\n"
    )
    assert why_zero([_zero(pytest_output)]) == (
        "FAILED test_answer_is_42 - AssertionError: assert '' == '42'"
    )
    assert why_zero([_zero("pip: command not found\nno pytest, giving up\n")]) == (
        "pip: command not found"
    )
    assert why_zero([_zero("")]) == "the verifier printed nothing"
    records = [
        ResultRecord(task="t/a", rollout=0, source=SourceSpec(env="counter"), trajectory=t)
        for t in (_zero("[ok] step\nbash: pytest: command not found [x]\n"),)
    ]
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(records, "results"))
    rendered = console.file.getvalue()  # type: ignore[attr-defined]
    assert "why 0" in rendered
    assert "bash: pytest: command not found [x]" in rendered  # markup escaped, not eaten


def test_run_help_renders_bracketed_words() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "needs the [ray] extra" in text
    assert "the task's [agent].timeout_sec" in text


async def test_a_directory_whose_only_task_is_broken_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "tasks" / "bad"
    bad.mkdir(parents=True)
    (bad / "task.toml").write_text("[task\nname = 'x'\n")
    async with HarborAdapter(cache_dir=tmp_path / "c") as adapter:
        env = await adapter.get_environment(tmp_path / "tasks")
        with pytest.raises(EnvError) as info:
            await env.reset(0)
        await env.aclose()
    message = str(info.value)
    assert "1 task(s) could not load and were skipped" in message
    assert "bad:" in message and "is not valid TOML" in message


@pytest.mark.docker
def test_the_seed_usage_without_async_with_leaves_no_unclosed_connector(
    docker_engine: DockerEngine,
) -> None:
    tasks = repr(str(EXAMPLES))
    script = (
        "import asyncio\n"
        "from llenvs_async.adapters.harbor import HarborAdapter\n"
        "async def main():\n"
        "    adapter = HarborAdapter()\n"  # the seed's usage: never closed
        f"    env = await adapter.get_environment({tasks}, max_steps=3)\n"
        "    await env.reset(0)\n"
        "    await env.aclose()\n"
        f"    again = await adapter.get_environment({tasks})\n"  # reconnects on use
        "    await again.reset(0)\n"
        "    await again.aclose()\n"
        "asyncio.run(main())\n"
        "print('done')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    assert "Unclosed" not in done.stderr, done.stderr


@pytest.mark.docker
async def test_an_adapter_engine_reconnects_after_its_environments_closed(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    adapter = HarborAdapter(cache_dir=tmp_path / "c")
    try:
        for _ in range(2):
            async with await adapter.get_environment(EXAMPLES) as env:
                state = await env.reset(0)
                step = await env.step(state, Action(text="echo hi"))
                assert "hi" in step.next_state.observation.text
            assert adapter.engine._client is None  # idle: nothing left open
    finally:
        await adapter.aclose()
    assert await harbor_containers(docker_engine) == []
