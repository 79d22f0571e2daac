#!/bin/bash
# One command per line: a scripted agent replays these as its actions.
cd /app/project
mkdir -p build
sed -n 's/^version = "\(.*\)"$/\1/p' meta.toml > build/VERSION
./tools/compile.sh
tar --sort=name --mtime=2020-01-01 --owner=0 --group=0 --numeric-owner -cf /app/release.tar build
sha256sum /app/release.tar > /app/release.sha256
