"""Layering: the package arrows the house allows, no package importing another package's
private module, and ``sandbox/`` (gVisor) built on ``docker/``, never the reverse. Every
import statement is checked (absolute or relative, top-level or function-local, under
``TYPE_CHECKING`` too). Runtimes are named in the docker layer's registry: ``"gvisor"``
resolves without importing sandbox first."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import llenvs_async
from llenvs_async.docker import DockerEngine, DockerEnvironment
from llenvs_async.docker.pool import WarmPool
from llenvs_async.docker.runtime import RUNC, get_runtime
from llenvs_async.errors import GvisorUnavailableError

PACKAGE = Path(llenvs_async.__file__).parent
FORBIDDEN = "llenvs_async.sandbox"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """``(line, module)`` for each module an import statement in ``path`` (a module under
    ``root``) names, made absolute (``from X import y`` names ``X`` and ``X.y``: y may be a
    module)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _violations(root: Path) -> list[str]:
    found = {
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in sorted(root.rglob("*.py"))
        for line, module in _imported(path)
        if module == FORBIDDEN or module.startswith(f"{FORBIDDEN}.")
    }
    return sorted(found)


# Which packages each package (or top-level module) may import. ``host`` (what every host
# shares) sits under both runtimes; ``integrations`` are leaves that only the CLI, the
# outermost layer, reaches (``serve``).
ALLOWED: dict[str, frozenset[str]] = {
    "host": frozenset(),
    "protocols": frozenset(),
    "backends": frozenset(),
    "serialization": frozenset(),
    "envs": frozenset(),
    "distributed": frozenset(),
    "runner": frozenset({"backends"}),
    "testing": frozenset({"backends"}),
    "docker": frozenset({"host", "protocols"}),
    "sandbox": frozenset({"host", "docker"}),
    "adapters": frozenset({"host", "docker", "sandbox", "protocols"}),
    "viewer": frozenset({"serialization"}),
    "integrations": frozenset({"adapters", "serialization", "runner", "backends", "docker"}),
    "estimation": frozenset({"runner"}),
    "shell_task": frozenset({"host", "protocols"}),  # the step rules every shell task shares
    "fork": frozenset({"host", "docker"}),  # the generic fork: commits, or a runtime's process fork
    "_reaper": frozenset({"backends", "docker", "sandbox"}),  # the one sweep of every kind
    "__init__": frozenset({"backends", "protocols", "runner"}),
}
PACKAGES = frozenset(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def _owner(module: str, root: Path) -> str:
    """The package a module is or belongs to (a module file's parent package)."""
    parts = module.split(".")
    return module if (root.joinpath(*parts) / "__init__.py").exists() else ".".join(parts[:-1])


def _arrows(root: Path = PACKAGE.parent) -> list[str]:
    """Imports of a package that the importer's entry in ``ALLOWED`` does not list, and of
    another package's private module or name."""
    found: set[str] = set()
    top = root / "llenvs_async"
    packages = frozenset(p.name for p in top.iterdir() if (p / "__init__.py").exists())
    for path in sorted(top.rglob("*.py")):
        name = _module_name(path, root)
        source = name.split(".")[1] if name.count(".") else "__init__"
        if source == "cli":
            continue  # the application: it may use every package
        home = _owner(name, root)
        for line, module in _imported(path, root):
            parts = module.split(".")
            if parts[0] != "llenvs_async" or len(parts) < 2:
                continue
            where = f"{path.relative_to(root)}:{line} imports {module}"
            target = parts[1]
            if target in packages and target != source and target not in ALLOWED.get(source, ()):
                found.add(f"{where} ({source} -> {target} is not an allowed arrow)")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and i), None)
            owner = None if private is None else _owner(".".join(parts[:private]), root)
            if owner is not None and not private_ok(home, owner):
                found.add(f"{where} (a private module or name of another package)")
    return sorted(found)


def private_ok(importer_package: str, owner_package: str) -> bool:
    """A private module or name may be used inside its own package and the packages below it."""
    return importer_package == owner_package or importer_package.startswith(owner_package + ".")


def test_every_import_follows_the_allowed_arrows() -> None:
    assert set(ALLOWED) - {"estimation", "shell_task", "fork", "_reaper", "__init__"} <= PACKAGES
    assert _arrows() == []


@pytest.mark.parametrize(
    ("module", "source", "why"),
    [
        ("runner/_x.py", "from ..docker import Container\n", "runner -> docker"),
        ("host/_x.py", "def f():\n    from ..protocols import get_protocol\n", "host -> protocols"),
        ("viewer/_x.py", "from ..serialization._values import X\n", "private module"),
        ("runner/_x.py", "from ..integrations.trl import rollout_func\n", "runner -> integrations"),
        ("sandbox/_x.py", "from llenvs_async.docker.engine import _client\n", "private module"),
    ],
)
def test_the_arrow_check_fails_on_a_forbidden_import(
    tmp_path: Path, module: str, source: str, why: str
) -> None:
    """A copy of the package with one forbidden import added fails the check, naming it."""
    shutil.copytree(PACKAGE, tmp_path / "llenvs_async", ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "llenvs_async" / module).write_text(source)
    found = _arrows(tmp_path)
    assert found, "the forbidden import was not caught"
    assert all(f.startswith(f"llenvs_async/{module}:") and why in f for f in found), found


def _cycles(root: Path = PACKAGE.parent) -> list[list[str]]:
    """Circles of modules importing each other (any import form, ``TYPE_CHECKING`` too; a
    package's ``__init__``, which gathers its modules' names, is not counted as a target)."""
    top = root / "llenvs_async"
    paths = {_module_name(p, root): p for p in top.rglob("*.py")}
    graph = {
        name: {t for _, t in _imported(path, root)
               if t in paths and t != name and paths[t].name != "__init__.py"}
        for name, path in paths.items()
    }  # fmt: skip
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert _cycles() == []


def test_the_circle_check_sees_one(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "llenvs_async", ignore=shutil.ignore_patterns("*.pyc"))
    host = tmp_path / "llenvs_async" / "host"
    (host / "_x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from ._y import Y\n")  # fmt: skip
    (host / "_y.py").write_text("from ._x import X\n")
    assert _cycles(tmp_path) == [["llenvs_async.host._x", "llenvs_async.host._y"]]


def test_docker_never_imports_sandbox() -> None:
    assert _violations(PACKAGE / "docker") == []


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("from ..sandbox.runsc import find_runsc\n", "llenvs_async.sandbox.runsc"),
        ("from .. import sandbox\n", "llenvs_async.sandbox"),
        ("def f():\n    import llenvs_async.sandbox.fork\n", "llenvs_async.sandbox.fork"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from llenvs_async.sandbox import Sandbox\n",
            "llenvs_async.sandbox",
        ),
    ],
)
def test_the_check_sees_every_form_of_import(tmp_path: Path, source: str, where: str) -> None:
    """The checker itself: each form is caught in a module placed as docker's would be."""
    fake = tmp_path / "llenvs_async" / "docker"
    fake.mkdir(parents=True)
    (fake / "mod.py").write_text(source)
    found = [module for _, module in _imported(fake / "mod.py", tmp_path)]
    assert where in found


def test_the_check_allows_what_docker_may_import(tmp_path: Path) -> None:
    fake = tmp_path / "llenvs_async" / "docker"
    fake.mkdir(parents=True)
    (fake / "mod.py").write_text("from ..errors import EnvError\nfrom . import engine\n")
    found = {module for _, module in _imported(fake / "mod.py", tmp_path)}
    assert "llenvs_async.errors" in found and "llenvs_async.docker.engine" in found
    assert not any(m.startswith(FORBIDDEN) for m in found)


def test_gvisor_resolves_by_name_in_a_fresh_process() -> None:
    """Importing the docker layer leaves sandbox unloaded; asking for ``"gvisor"`` loads it
    and gives the runtime it registered."""
    script = (
        "import sys\n"
        "from llenvs_async.docker import DockerEnvironment\n"
        "from llenvs_async.docker.runtime import get_runtime\n"
        "before = 'llenvs_async.sandbox' in sys.modules\n"
        "runtime = get_runtime('gvisor')\n"
        "from llenvs_async.sandbox import GVISOR, Sandbox\n"
        "print(before, runtime is GVISOR, runtime.name, sorted(runtime.capabilities))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "gvisor", "['checkpoint']"]


def test_an_unknown_runtime_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"runtime must be 'runc' or 'gvisor', got 'kata'"):
        get_runtime("kata")
    with pytest.raises(ValueError, match=r"runtime must be 'runc' or 'gvisor', got 'kata'"):
        DockerEnvironment(image="busybox", runtime="kata")


def test_a_runtime_is_taken_by_name_or_as_an_object() -> None:
    by_name, given = DockerEnvironment(image="busybox"), DockerEnvironment(image="b", runtime=RUNC)
    assert by_name.runtime is RUNC and given.runtime is RUNC
    assert given.container_runtime == "runc"


def test_gvisor_refuses_a_warm_pool_before_looking_for_runsc() -> None:
    pool = WarmPool(DockerEngine(), 1)
    with pytest.raises(ValueError, match=r"warm pool holds Docker containers.*'gvisor'"):
        DockerEnvironment(image="busybox", pool=pool, runtime="gvisor")


def test_gvisor_without_runsc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLENVS_RUNSC", "/nonexistent/runsc")
    with pytest.raises(GvisorUnavailableError, match=r"runsc is not installed.*ensure-gvisor"):
        DockerEnvironment(image="busybox", runtime="gvisor")


def test_only_the_engine_module_holds_the_docker_client() -> None:
    """aiodocker and aiohttp (the client and its errors) are imported by the engine module
    alone: every other module reaches Docker through ``DockerEngine``."""
    clients = {"aiodocker", "aiohttp"}
    found = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for _, module in _imported(path)
        if module.split(".")[0] in clients
    }
    assert found == {"docker/engine.py"}
