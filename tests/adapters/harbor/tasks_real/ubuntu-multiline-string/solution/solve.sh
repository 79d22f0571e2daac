#!/bin/bash
set -euo pipefail
echo "welcome
to the
machine" > /root/motd.txt
