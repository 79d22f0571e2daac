#!/bin/bash
if [ "$(grep -c greeting=hello /app/settings)" = 1 ] && [ -f /app/done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
