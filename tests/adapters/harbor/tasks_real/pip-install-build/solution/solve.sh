#!/bin/bash
set -euo pipefail
python -c 'import tomli_w; open("/app/out.toml", "w").write(tomli_w.dumps({"x": 1}))'
