#!/bin/bash
# harbor-canary GUID 0b9e5c1e-looprl-test-fixture
cd /app
if pytest -q -rA -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
