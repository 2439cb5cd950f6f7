#!/bin/bash
cd /app
fail=0
check() {  # FILE N EXPECTED
  got=$(bash /app/topwords.sh "$1" "$2" 2>&1)
  if [ "$got" != "$3" ]; then echo "FAIL topwords.sh $1 $2: got [$got] want [$3]"; fail=1; fi
}
check /tests/fixture.txt 2 "3 apple
3 banana"
check /tests/fixture.txt 4 "3 apple
3 banana
2 cherry
1 date"
check /app/notes.txt 1 "3 the"
if [ $fail -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
