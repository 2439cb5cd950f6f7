#!/bin/bash
cd /app
ok=1
out=$(python csvcut.py --columns city,name /tests/people.csv)
[ "$out" = "city,name
london,ada
wilmslow,alan" ] || { echo "FAIL --columns city,name: [$out]"; ok=0; }
out=$(python csvcut.py /tests/people.csv)
[ "$out" = "$(cat /tests/people.csv)" ] || { echo "FAIL plain: [$out]"; ok=0; }
err=$(python csvcut.py --columns nope /tests/people.csv 2>&1 >/dev/null); status=$?
[ $status -eq 2 ] && [ "$err" = "unknown column: nope" ] || { echo "FAIL unknown: $status [$err]"; ok=0; }
echo $ok > /logs/verifier/reward.txt
