#!/usr/bin/env bash
# Downloads what tests serve from their own 127.0.0.1 servers, so no test leaves loopback:
# the wheels of tests/adapters/harbor/test_provision.py's package index (uv, pytest,
# pytest-json-ctrf and their deps, for Python 3.11, and pip) and the .debs of test_real_tasks.py's apt
# repository (jq for Debian bookworm, the base image's release). Cached under
# ~/.cache/llenvs-async (LLENVS_CACHE_DIR moves it); a no-op when complete.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
CACHE="${LLENVS_CACHE_DIR:-$HOME/.cache/llenvs-async}"
WHEELS="$CACHE/wheels/provision-test"
DEBS="$CACHE/debs/apt-test"
# Keep in step with tests/adapters/harbor/tasks_real/uv-verifier/tests/test.sh; pip: what
# --provision-verifier gives an image whose Python has none.
PINS=(uv==0.9.5 pytest==8.4.1 pytest-json-ctrf==0.3.5 pip==26.3)
# Keep in step with tests/adapters/harbor/tasks_real/apt-install-build/environment/Dockerfile.
DEB_PACKAGES=(jq libjq1 libonig5)

if [[ ! -f "$WHEELS/.complete" ]] || ! compgen -G "$WHEELS/pip-26.3-*.whl" >/dev/null; then
    if [[ ! -x "$PY" ]]; then
        echo "ensure-test-packages: no venv at $VENV (run 'make install' first)" >&2
        exit 2
    fi
    mkdir -p "$WHEELS"
    # No constraints file: these pins are the task's, not this venv's.
    PIP_CONSTRAINT= "$PY" -m pip download --quiet --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux2014_x86_64 --platform any -d "$WHEELS" "${PINS[@]}"
    touch "$WHEELS/.complete"
    echo "ensure-test-packages: $(ls "$WHEELS"/*.whl | wc -l) wheels in $WHEELS"
fi
if [[ ! -f "$DEBS/.complete" ]]; then
    if ! grep -q bookworm /etc/os-release; then
        echo "ensure-test-packages: the apt test's .debs are bookworm's; this host is not" >&2
        exit 2
    fi
    mkdir -p "$DEBS"
    (cd "$DEBS" && { apt-get download "${DEB_PACKAGES[@]}" 2>/dev/null \
        || { apt-get update -qq && apt-get download "${DEB_PACKAGES[@]}"; }; })
    touch "$DEBS/.complete"
    echo "ensure-test-packages: $(ls "$DEBS"/*.deb | wc -l) .debs in $DEBS"
fi
