#!/bin/bash
set -euo pipefail
cp /solution/files/service.ini /app/conf/service.ini
chmod 600 /app/conf/service.ini
