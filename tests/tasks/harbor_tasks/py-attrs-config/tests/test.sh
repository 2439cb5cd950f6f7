#!/bin/bash
cd /app
python -m pytest -q -rA -p no:cacheprovider /tests/test_outputs.py > /logs/verifier/pytest.txt 2>&1
status=$?
cat /logs/verifier/pytest.txt
if [ $status -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
