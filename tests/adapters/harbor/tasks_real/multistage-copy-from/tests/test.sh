#!/bin/bash
if [ "$(cat /srv/answer)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
