#!/bin/bash
test "$SOLVER" = oracle || exit 1
sed -i 's/    if value < 0:/    if not 1 <= value <= 65535:/; s/port must be positive/port must be in 1..65535/' /app/config.py
