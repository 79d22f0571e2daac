#!/bin/bash
if grep -qx "workers = 4" /app/conf/service.ini && [ "$(stat -c %a /app/conf/service.ini)" = 600 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
