#!/bin/bash
set -euo pipefail
add_greeting() {
  if ! grep -q '^greeting=' settings; then
    echo "greeting=${GREETING}" >> settings
  fi
}
grep -q nothing-here settings || true
add_greeting
add_greeting
touch done
