#!/bin/bash
if [ "$(wc -l < /root/motd.txt)" = 3 ] && [ "$(sed -n 2p /root/motd.txt)" = "to the" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
