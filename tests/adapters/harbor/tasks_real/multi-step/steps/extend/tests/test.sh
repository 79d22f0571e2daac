#!/bin/bash
source /tests/lib.sh
[ -f /app/hint.txt ] && [ ! -e /app/setup.sh ] || { echo "workdir/ was not staged"; reward 0; exit 0; }
if [ "$(cat /app/f)" = "$(printf 'one\ntwo')" ]; then reward 1; else reward 0; fi
