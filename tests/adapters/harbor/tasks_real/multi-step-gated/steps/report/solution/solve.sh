#!/bin/bash
wc -l < /app/f > /app/count.txt
