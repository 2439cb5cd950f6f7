#!/bin/sh
# Harbor's contract: the reward goes to /logs/verifier/reward.txt (1: every check passed).
cd /app || exit 1
fail=0
check() {  # FILE EXPECTED
  got=$(sh /app/linestats.sh "$1" 2>&1)
  if [ "$got" != "$2" ]; then echo "FAIL linestats.sh $1: got [$got] want [$2]"; fail=1; fi
}
check /tests/fixture.txt "lines 6
nonempty 3
longest 11"
check /app/notes.txt "lines 4
nonempty 3
longest 24"
if [ $fail -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
