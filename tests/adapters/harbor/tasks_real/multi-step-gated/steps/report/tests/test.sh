#!/bin/bash
source /tests/lib.sh
if [ "$(tr -d ' ' < /app/count.txt 2>/dev/null)" = 2 ]; then reward 1; else reward 0; fi
