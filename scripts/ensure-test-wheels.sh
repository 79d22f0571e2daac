#!/usr/bin/env bash
# Downloads the wheels the provisioning test serves from its own 127.0.0.1 package index
# (tests/adapters/harbor/test_provision.py: uv, pytest, pytest-json-ctrf and their deps for
# Python 3.11), so that test never leaves loopback. Cached under
# ~/.cache/llenvs-async/wheels/provision-test (LLENVS_CACHE_DIR moves it); a no-op when complete.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
CACHE="${LLENVS_CACHE_DIR:-$HOME/.cache/llenvs-async}"
WHEELS="$CACHE/wheels/provision-test"
# Keep in step with tests/adapters/harbor/tasks_real/uv-verifier/tests/test.sh.
PINS=(uv==0.9.5 pytest==8.4.1 pytest-json-ctrf==0.3.5)

if [[ -f "$WHEELS/.complete" ]]; then
    exit 0
fi
if [[ ! -x "$PY" ]]; then
    echo "ensure-test-wheels: no venv at $VENV (run 'make install' first)" >&2
    exit 2
fi
mkdir -p "$WHEELS"
# No constraints file: these pins are the task's, not this venv's.
PIP_CONSTRAINT= "$PY" -m pip download --quiet --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux2014_x86_64 --platform any -d "$WHEELS" "${PINS[@]}"
touch "$WHEELS/.complete"
echo "ensure-test-wheels: $(ls "$WHEELS"/*.whl | wc -l) wheels in $WHEELS"
