#!/bin/bash
set -euo pipefail
echo '{"a": 7}' | jq .a > /app/a.txt
