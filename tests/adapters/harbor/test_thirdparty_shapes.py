"""Third-party verifier shapes (``tasks_thirdparty/``, issue 30): ``pip install`` of pinned
packages in ``test.sh`` provisioned at build time, a uvx Python the stand-in lacks named as
such, the ``--allow-network`` hint only where it helps, and the oracle over the whole set
(real Docker; builds reach only a package index this test serves on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters.harbor import load_local_dataset
from llenvs_async.adapters.harbor.images.image import BuildSettings, TaskImages
from llenvs_async.adapters.harbor.images.image_names import ImageResolver
from llenvs_async.adapters.harbor.images.provision import (
    PROVISION_MARK,
    detect_provision,
    offline_test_sh,
    provision_dockerfile,
    provision_hint,
)
from llenvs_async.adapters.harbor.images.provision_pip import pip_install
from llenvs_async.adapters.harbor.images.uv_standin import with_uv_stages
from llenvs_async.adapters.harbor.tasks.task import load_task
from llenvs_async.adapters.harbor.verify.network import check_offline_verifier
from llenvs_async.cli import main
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.images import PYTHON_STANDIN, ensure_uv_standin
from llenvs_async.errors import VerifierError
from tests._support import require_built_images

from ._local_index import WHEELS, cached_packages, serve, simple_tree
from .conftest import harbor_containers

TASKS = Path(__file__).resolve().parent / "tasks_thirdparty"
PIP_SHAPED = {"pip-pinned", "pip-pinned-silent", "pip3-ctrf", "python-m-pip", "task-bug-wrong-path",
              "pip-alternative", "no-pip-python3"}  # fmt: skip


def _test_sh(name: str) -> str:
    return (TASKS / name / "tests" / "test.sh").read_text()


def test_the_pinned_pip_shapes_are_recognised_and_nothing_else() -> None:
    dataset = load_local_dataset(TASKS)
    assert not dataset.unloadable
    found = {t.short_name: detect_provision(_test_sh(t.short_name)) for t in dataset.tasks}
    assert {name for name, p in found.items() if p is not None} == PIP_SHAPED | {"uvx-python-312"}
    ctrf = found["pip3-ctrf"]
    assert ctrf is not None and ctrf.uv_version is None
    (line,) = ctrf.pip
    (install,) = line.installs
    assert install.command == ("pip3",)
    assert install.requirements == ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
    assert install.options == ("--break-system-packages", "--no-cache-dir")
    python_m = found["python-m-pip"]
    assert python_m is not None and python_m.pip[0].installs[0].command == ("python", "-m", "pip")
    uvx = found["uvx-python-312"]
    assert uvx is not None and uvx.pythons == ("3.12",)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("pip install pytest==8.4.1", ("pytest==8.4.1",)),
        ("pip3.12 install -q 'pytest[testing]==8.4.1' >/dev/null 2>&1 || :", "3.12"),
        ("python3 -m pip install --progress-bar off pytest==8.4.1 &>/dev/null", ()),
        ("pip install pytest", False),  # unpinned: not provisioned
        ("pip install 'pytest>=8'", False),
        ("pip install -r /tests/requirements.txt", False),
        ("pip install --user pytest==8.4.1", False),
        ("pip install -i https://example.org/simple pytest==8.4.1", False),
        ("pip install --index-url=https://example.org/simple pytest==8.4.1", False),
        ("pip install pytest==8.4.1 && pytest /tests", False),  # another command in the chain
        ("cd /app && pip install pytest==8.4.1", False),
        ("pip install pytest==8.4.1 | tee /tmp/log", False),
        ("pip install pytest==8.4.1 &", False),
        ("pip install --timeout 60 --retries=2 pytest==8.4.1 2>&1 >/dev/null", ("pytest==8.4.1",)),
        # the public shape: flags before the package, an alternative across a continuation
        (
            "pip install --quiet --no-cache-dir pytest==8.2.2 2>/dev/null ||   pip install --quiet "
            "--no-cache-dir --break-system-packages pytest==8.2.2",
            ("pytest==8.2.2",),
        ),
        (
            "pip3 install x==1 && python3 -m pip install -q y==2; pip install z==3",
            ("x==1", "y==2", "z==3"),
        ),
        ("pip list", None),
        ("python3 -m pytest /tests", None),
    ],
)
def test_pip_install_lines(line: str, expected: object) -> None:
    parsed = pip_install(line)
    if expected is False or expected is None:
        assert parsed is expected
        if expected is False:
            assert detect_provision(f"#!/bin/bash\n{line}\n") is None  # whole script left alone
        return
    assert parsed is not None and parsed is not False and parsed is not True
    if isinstance(expected, str):
        assert parsed.installs[0].python == expected
    elif expected:
        assert parsed.requirements == expected
        assert all(i.python is None for i in parsed.installs)


def test_an_alternative_across_a_continued_line_is_one_install_and_one_no_op() -> None:
    script = _test_sh("pip-alternative")
    found = detect_provision(script)
    assert found is not None
    (line,) = found.pip
    assert line.operators == ("||",) and len(line.installs) == 2
    assert line.shell() == (
        "pip install --quiet --no-cache-dir pytest==8.4.1 || "
        "pip install --quiet --no-cache-dir --break-system-packages pytest==8.4.1"
    )
    offline = offline_test_sh(script)
    assert offline is not None
    lines = offline[0].splitlines()
    assert lines[1].startswith(": llenvs-async provisioned this at build time: 'pip install")
    assert lines[2] == "" and lines[3] == "python3 -m pytest /tests/test_outputs.py -rA"


def test_the_uploaded_script_skips_the_installs_with_its_line_numbers() -> None:
    script = _test_sh("pip3-ctrf")
    offline = offline_test_sh(script)
    assert offline is not None
    text, env = offline
    assert env == {}  # no uv: nothing to take offline
    assert text.count("\n") == script.count("\n")
    lines = text.splitlines()
    assert lines[2].startswith(": llenvs-async provisioned this at build time: 'pip3 install")
    assert lines[3:5] == ["", ""]  # its continued lines
    assert "python3 -m pytest --ctrf" in lines[6]
    both = offline_test_sh(_test_sh("uvx-python-312"))
    assert both is not None and both[1] == {"UV_OFFLINE": "1"}


def test_the_dockerfile_installs_as_written_through_the_given_index() -> None:
    found = detect_provision(_test_sh("pip-pinned-silent"))
    assert found is not None
    url = "http://127.0.0.1:9/simple"
    text = provision_dockerfile("FROM python:3.12-slim\nUSER app\n", found, index_url=url)
    run = [line for line in text.splitlines() if line.startswith("RUN ")][-1]
    assert PROVISION_MARK in run
    assert f"export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore " \
           f"PIP_NO_CACHE_DIR=1 PIP_INDEX_URL={url} && " in run  # fmt: skip
    assert "( pip install -q pytest==8.4.1 )" in run
    assert "|| true" not in run  # a failure fails the build
    assert "llenvs-uv-provision" not in text  # no uv stage for a pip-only script
    # pip itself, for an image whose Python has none, from the wheel the pip stage fetched
    assert f"python3 -m pip download --index-url {url} --no-deps" in text
    assert "python3 -m pip --version >/dev/null 2>&1 || {" in run
    assert text.splitlines()[-1] == "USER app"


def test_a_failed_provisioning_step_names_the_flag_and_both_pythons() -> None:
    found = detect_provision(_test_sh("uvx-python-312"))
    assert found is not None
    log = [
        "Step 5/7 : RUN echo llenvs-async --provision-verifier ... uvx -p 3.12 ...",
        f"{PROVISION_MARK}: the image has Python 3.11.2",
        "error: No interpreter found for Python 3.12 in managed installations or search path",
    ]
    hint = provision_hint(log, found, base="python:3.12-slim", standin=(PYTHON_STANDIN, "3.11"))
    assert hint is not None
    assert "--provision-verifier" in hint
    assert "asks for Python 3.12" in hint and "has Python 3.11" in hint
    assert f"the stand-in {PYTHON_STANDIN} for python:3.12-slim" in hint
    assert "--base-image 'python:3.12-slim=IMAGE'" in hint
    elsewhere = ["Step 2/7 : RUN make", "make: *** [all] Error 2"]
    assert provision_hint(elsewhere, found, base="python:3.12-slim") is None


def test_a_uv_image_becomes_a_stage_built_from_its_wheel() -> None:
    text = with_uv_stages(
        "ARG V=1\nFROM python:3.11-slim\nCOPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/\n"
        "FROM astral-sh/uv:0.8.15 AS tools\n",
        {"ghcr.io/astral-sh/uv:0.8.15", "astral-sh/uv:0.8.15"},
        index_url="http://127.0.0.1:9/simple",
    )
    lines = text.splitlines()
    assert lines[0] == "ARG V=1"  # still before every FROM: still global
    assert lines[1] == "FROM python:3.12-slim AS llenvs-uv-0-8-15"
    assert "pip download --index-url http://127.0.0.1:9/simple --no-deps" in lines[2]
    assert "uv==0.8.15" in lines[2] and "cp /llenvs-x/uv-*.data/scripts/uv " in lines[2]
    assert lines[4] == "COPY --from=llenvs-uv-0-8-15 /uv /uvx /bin/"
    assert lines[5] == "FROM llenvs-uv-0-8-15 AS tools"
    assert len([line for line in lines if "AS llenvs-uv-" in line]) == 1  # one stage a version
    hint = ImageResolver({}).how_to_map("ghcr.io/astral-sh/uv:0.8.15")
    assert "--build-network" in hint and "uv 0.8.15 wheel" in hint


def test_allow_network_is_named_only_where_it_can_help() -> None:
    task = load_local_dataset(TASKS).resolve("pip-pinned")[1]
    log = "WARNING: Retrying ... Failed to establish a new connection: [Errno -3] ...\n"
    messages = {}
    for bridge in (True, False):
        with pytest.raises(VerifierError) as info:
            check_offline_verifier(task, log, network=False, bridge=bridge, provisioned=False)
        messages[bridge] = str(info.value)
    assert "(pass --allow-network" in messages[True]
    assert "(pass --allow-network" not in messages[False]
    assert "--allow-network would not help" in messages[False]
    assert "--bridge=none" in messages[False]
    for message in messages.values():  # the way that does work offline, both times
        assert "--build-network --provision-verifier" in message


def _task_set(tmp_path: Path, url: str) -> Path:
    """The task set, its build-time downloads pointed at ``url`` (the test's index) and uv
    barred from downloading a CPython (no test may leave loopback)."""
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    present = tasks / "pytest-present" / "environment" / "Dockerfile"
    present.write_text(present.read_text().replace("RUN ", f"RUN PIP_INDEX_URL={url} ", 1))
    uvx = tasks / "uvx-python-312" / "environment" / "Dockerfile"
    uvx.write_text(uvx.read_text() + "ENV UV_PYTHON_DOWNLOADS=never\n")
    return tasks


def _records(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {str(r["key"]["task"]).rsplit("/", 1)[-1]: r["trajectory"] for r in records}


@pytest.mark.docker
@pytest.mark.slow
async def test_the_oracle_passes_every_pinned_pip_shape_with_the_documented_flags(
    tmp_path: Path,
    docker_engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await require_built_images(docker_engine, PYTHON_STANDIN)
    simple_tree(cached_packages(WHEELS), tmp_path / "index")
    out = tmp_path / "third.jsonl"
    with serve(tmp_path / "index") as (url, requests):
        tasks = _task_set(tmp_path, f"{url}/simple")
        args = ["run", str(tasks), "-o", str(out), "--build-network", "--provision-verifier"]
        await asyncio.to_thread(main, [*args, "--provision-index-url", f"{url}/simple", "-q"])
    printed = capsys.readouterr().out
    assert "/simple/pytest/" in requests and "/simple/pytest-json-ctrf/" in requests
    assert "/simple/pip/" in requests  # the wheel a Python without pip is given pip from
    assert "/simple/uv/" in requests  # the uv image's stand-in, from its wheel
    trajectories = _records(out)
    rewards = {
        name: t["transitions"][-1]["reward"] if t["transitions"] else None
        for name, t in trajectories.items()
    }
    assert rewards == {
        "pytest-present": 1.0,
        "pip-pinned": 1.0,
        "pip-pinned-silent": 1.0,
        "pip3-ctrf": 1.0,
        "python-m-pip": 1.0,
        "pip-alternative": 1.0,  # the `||` of two installs across a continued line
        "no-pip-python3": 1.0,  # its python3 had no pip: given one from pip's wheel
        "pip-unpinned-silent": 0.0,  # unpinned: left as written, fails offline
        "task-bug-wrong-path": 0.0,
        "needs-python-312": 0.0,  # right on 3.12, run on the 3.11 stand-in: said next to it
        "uv-image-copy": 1.0,  # ghcr.io/astral-sh/uv:0.9.5 from the uv wheel of the index
        "uvx-python-312": None,
    }
    gap = trajectories["needs-python-312"]["transitions"][-1]["info"]
    assert gap["python_gap"] == (
        f"the task asked for docker.io/library/python:3.12-slim; the stand-in {PYTHON_STANDIN} "
        "has Python 3.11"
    )
    assert gap["verifier_output"].endswith(f"[note: {gap['python_gap']}]")
    assert "python_gap" not in trajectories["python-m-pip"]["transitions"][-1]["info"]
    unpinned = trajectories["pip-unpinned-silent"]["transitions"][-1]["info"]
    assert "No module named pytest" in unpinned["verifier_output"]
    error = trajectories["uvx-python-312"]["error"]
    assert error is not None and error["type"] == "ImageError", error
    for words in ("--provision-verifier", "asks for Python 3.12", "has Python 3.11"):
        assert words in error["message"], (words, error["message"])
    for name, trajectory in trajectories.items():  # the build's share in every timing
        info = trajectory["info"]
        assert info["setup_sec"] > 0 and info["wall_sec"] >= info["setup_sec"], (name, info)
        assert info["started_at"].endswith("Z")
    # The summary, printed to a file: full task names and the error's reason.
    assert "thirdparty/pip-unpinned-silent" in printed and "…" not in printed
    assert "ImageError: building the image of task 'thirdparty/uvx-python-312'" in printed
    assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
async def test_a_prebuilt_image_is_not_provisioned_so_its_test_sh_runs_as_written(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """A task naming a local prebuilt image AND a Dockerfile runs the prebuilt one: nothing
    was fetched at build time, so its test.sh must not be rewritten to skip the installs."""
    await require_built_images(docker_engine, PYTHON_STANDIN)
    task_dir = tmp_path / "prebuilt"
    shutil.copytree(TASKS / "pip-pinned-silent", task_dir)
    toml = task_dir / "task.toml"
    prebuilt = f'[environment]\ndocker_image = "{PYTHON_STANDIN}"\n'
    toml.write_text(toml.read_text().replace("[environment]\n", prebuilt))
    task = load_task(task_dir)
    images = TaskImages(build=BuildSettings(provision_verifier=True))
    assert await images.ensure(docker_engine, task) == PYTHON_STANDIN
    assert not images.provisioned(task)


@pytest.mark.docker
async def test_build_standins_makes_the_uv_image_from_its_wheel(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """``images build-standins --uv 0.9.5``: ``ghcr.io/astral-sh/uv:0.9.5`` as a local image
    holding ``/uv`` and ``/uvx`` of that version (from the test's index), which a task's
    Dockerfile then resolves to offline."""
    await require_built_images(docker_engine, PYTHON_STANDIN)
    tag = "ghcr.io/astral-sh/uv:0.9.5"
    assert await docker_engine.inspect_image(tag) is None  # nobody else's image is removed
    simple_tree(cached_packages(WHEELS), tmp_path / "index")
    container = None
    try:
        with serve(tmp_path / "index") as (url, requests):
            info = await ensure_uv_standin(docker_engine, "0.9.5", index_url=f"{url}/simple")
        assert info.built and "/simple/uv/" in requests
        assert await ImageResolver({}).resolve(docker_engine, tag) == tag
        config = {"Image": tag, "Entrypoint": ["/uv"], "Labels": docker_engine.labels}
        container = await docker_engine.create_container(config, action="uv", image=tag)
        for name in ("uv", "uvx"):
            with await docker_engine.get_archive(container, f"/{name}") as tar:
                tar.extractall(tmp_path / "bin", filter="data")
        (tmp_path / "bin" / "uv").chmod(0o755)
        version = await asyncio.create_subprocess_exec(
            str(tmp_path / "bin" / "uv"), "--version", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await version.communicate()
        assert out.decode().startswith("uv 0.9.5"), out
        assert (tmp_path / "bin" / "uvx").stat().st_size > 0
    finally:
        if container is not None:
            await docker_engine.remove_container(container)
        await docker_engine.remove_image(tag)
