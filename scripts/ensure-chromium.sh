#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver are installed for the `browser` test tier:
# Debian's `chromium` and `chromium-driver` (as root via apt-get). A fast no-op when both exist.
set -euo pipefail

PACKAGES=(chromium chromium-driver)

say() { echo "ensure-chromium: $*"; }
die() { echo "ensure-chromium: ERROR: $*" >&2; exit 1; }
present() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
# The package's version (instant), not `chromium --version` (starts the browser).
version() { dpkg-query -W -f='${Version}' chromium 2>/dev/null || echo '?'; }

if present; then
    say "present (chromium $(version))"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "chromium/chromedriver are missing, and installing them needs root: rerun as root"
command -v apt-get >/dev/null 2>&1 || die "chromium/chromedriver are missing, and this is not a Debian machine (no apt-get): install them yourself"

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
present || die "chromium or chromedriver is missing even after installing ${PACKAGES[*]}"
say "installed (chromium $(version))"
