#!/bin/bash
got=$(python3 -c "import urllib.request as u; print(u.urlopen('http://kv:8765/k', timeout=10).read().decode())")
if [ "$got" = v ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
