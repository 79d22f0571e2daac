#!/usr/bin/env bash
# Build the local Debian base image (llenvs/base:bookworm, also tagged debian:bookworm-slim)
# from a debootstrap rootfs, unless it already exists. Needs root, debootstrap and an engine.
# Env: PYTHON (default python3). Extra arguments go to the builder (e.g. --force).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m llenvs_async.cli images build-base "$@"
