#!/usr/bin/env bash
set -euo pipefail
python - <<'PY'
import json
with open("data.json") as f:
    items = json.load(f)["items"]
with open("sum.txt", "w") as out:
    out.write(f"{sum(items)}\n")
PY
