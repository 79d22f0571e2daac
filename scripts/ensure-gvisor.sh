#!/usr/bin/env bash
# Make sure gVisor's `runsc` is installed (the `gvisor` test tier and `--runtime gvisor`).
# A fast no-op when `runsc` is on PATH; otherwise, as root on Debian, installs the `runsc`
# package from Debian's repositories. Nothing is started: runsc runs per sandbox.
set -euo pipefail

say() { echo "ensure-gvisor: $*"; }
die() { echo "ensure-gvisor: ERROR: $*" >&2; exit 1; }
present() { command -v runsc >/dev/null 2>&1 && runsc --version >/dev/null 2>&1; }
version() { runsc --version 2>/dev/null | head -n 1; }

if present; then
    say "$(version)"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "runsc is missing, and installing it needs root: rerun as root, or install gVisor's runsc yourself"
command -v apt-get >/dev/null 2>&1 || die "runsc is missing, and this is not a Debian machine (no apt-get): install gVisor's runsc yourself (https://gvisor.dev/docs/user_guide/install/)"

say "installing runsc from Debian's packages"
apt-get update -q || die "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runsc \
    || die "apt-get install runsc failed"
present || die "runsc is still missing after installing the runsc package"
say "$(version)"
