#!/usr/bin/env bash
# Make sure a Docker engine answers. Uses a running engine when `docker info` works;
# otherwise, as root on Debian, installs docker.io (plus busybox-static and debootstrap,
# for local images) from Debian's packages and starts dockerd in the background.
# Env: DOCKERD_LOG (default /var/log/llenvs-dockerd.log), DOCKERD_WAIT (seconds, default 60).
set -euo pipefail

LOG=${DOCKERD_LOG:-/var/log/llenvs-dockerd.log}
WAIT=${DOCKERD_WAIT:-60}
PACKAGES=(docker.io busybox-static debootstrap)

say() { echo "ensure-docker: $*"; }
die() { echo "ensure-docker: ERROR: $*" >&2; exit 1; }
answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }
version() { docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'; }

wait_for_engine() {
    local waited=0
    until answers; do
        if [ "$waited" -ge "$WAIT" ]; then
            [ -f "$LOG" ] && tail -n 20 "$LOG" >&2
            die "the Docker engine did not answer within ${WAIT}s (log: $LOG)"
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

if answers; then
    say "engine answers (Docker $(version))"
    exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer: start that engine, or unset DOCKER_HOST to use a local one"
fi
[ "$(id -u)" = 0 ] || die "no Docker engine answers, and installing one needs root: start one, or rerun as root"
command -v apt-get >/dev/null 2>&1 || die "no Docker engine answers, and this is not a Debian machine (no apt-get): install and start Docker yourself"

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} from Debian's packages"
    apt-get update -q || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || die "apt-get install ${missing[*]} failed"
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    say "dockerd is running but not answering yet; waiting"
else
    command -v dockerd >/dev/null 2>&1 || die "dockerd is missing even after installing docker.io"
    mkdir -p "$(dirname "$LOG")"
    say "starting dockerd --bridge=none --iptables=false (log: $LOG)"
    nohup dockerd --bridge=none --iptables=false >"$LOG" 2>&1 </dev/null &
fi
wait_for_engine
say "engine answers (Docker $(version))"
