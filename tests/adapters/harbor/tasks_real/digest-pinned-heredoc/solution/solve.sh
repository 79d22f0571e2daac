#!/bin/bash
set -euo pipefail
cat > report.md <<'EOF'
# Report
EOF
tr '[:lower:]' '[:upper:]' < words.txt >> report.md
