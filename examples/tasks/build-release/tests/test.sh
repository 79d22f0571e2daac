#!/bin/bash
# Verifier for build-release: writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }

[ "$(cat /app/project/build/VERSION 2>/dev/null)" = "2.3.1" ] || fail "build/VERSION should hold 2.3.1"
expected=$(printf 'tiny-app v2.3.1\n== src/a.txt\nhello from module a\n== src/b.txt\nhello from module b')
[ "$(cat /app/project/build/app.txt 2>/dev/null)" = "$expected" ] || fail "build/app.txt is wrong or missing"
[ -f /app/release.tar ] || fail "/app/release.tar is missing"
listing=$(tar -tf /app/release.tar | sort | tr '\n' ' ')
[ "$listing" = "build/ build/VERSION build/app.txt " ] || fail "release.tar holds: $listing"
[ -z "$(tar -tvf /app/release.tar | grep -v ' 0/0 ')" ] || fail "release.tar entries must be owned by 0/0"
[ -f /app/release.sha256 ] || fail "/app/release.sha256 is missing"
(cd / && sha256sum -c /app/release.sha256 >/dev/null 2>&1) || fail "/app/release.sha256 does not match /app/release.tar"
grep -q ' /app/release.tar$' /app/release.sha256 || fail "/app/release.sha256 should name /app/release.tar"
echo "PASS"
echo 1 > /logs/verifier/reward.txt
