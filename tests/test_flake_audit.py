"""The flake audit's harness (scripts/flake-audit.py): a run past its time is interrupted as
Ctrl-C would interrupt it, so its fixtures tear down, and is reported as timed out; a kill
would leave its containers and sandboxes running, loading every later run."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flake_audit", ROOT / "scripts/flake-audit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_past_its_time_is_interrupted_and_its_fixtures_tear_down(tmp_path: Path) -> None:
    audit = load_audit()
    started, torn_down = tmp_path / "started", tmp_path / "torn-down"
    (tmp_path / "test_stuck.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.fixture\ndef resource():\n    try:\n"
        "        yield\n    finally:\n"
        f"        open({str(torn_down)!r}, 'w').close()\n\n\n"
        f"def test_stuck(resource):\n    open({str(started)!r}, 'w').close()\n"
        "    time.sleep(600)\n"
    )
    proc = audit.start_pytest([str(tmp_path / "test_stuck.py")])
    try:
        deadline = time.monotonic() + 120
        while not started.exists():  # the test is inside its fixture: the precondition
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        code, output = audit.finish(proc, timeout=0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == -1 and "timed out after 0 s" in output
    assert "KeyboardInterrupt" in output, output
    assert torn_down.exists(), output  # the fixture's finally ran: nothing it held is left


def test_a_run_in_time_reports_its_exit_code_and_failed_tests(tmp_path: Path) -> None:
    audit = load_audit()
    (tmp_path / "test_mixed.py").write_text(
        "def test_ok():\n    pass\n\n\ndef test_bad():\n    assert False\n"
    )
    code, failed, seconds, output = audit.run_tier([str(tmp_path / "test_mixed.py")], 300)
    assert code == 1 and seconds > 0
    assert len(failed) == 1 and failed[0].endswith("/test_mixed.py::test_bad"), output
