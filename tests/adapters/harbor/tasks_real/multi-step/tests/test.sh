#!/bin/bash
# The task-level verifier: step 'create' has no tests/ of its own and falls back to it.
source /tests/lib.sh
if [ "$(cat /app/f 2>/dev/null)" = one ]; then reward 1; else reward 0; fi
