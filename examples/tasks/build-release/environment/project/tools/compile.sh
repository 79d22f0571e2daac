#!/bin/bash
# Concatenates src/*.txt under a versioned header into build/app.txt.
set -euo pipefail
[ -f build/VERSION ] || { echo "compile.sh: build/VERSION not found (run me from the project root after writing it)" >&2; exit 1; }
version=$(cat build/VERSION)
{
  echo "tiny-app v${version}"
  for f in src/*.txt; do
    echo "== ${f}"
    cat "$f"
  done
} > build/app.txt
echo "compiled build/app.txt (v${version})"
