#!/bin/bash
cd /app
python - <<'PY'
import re
src = open("stats.py").read()
src = src.replace("""    mid = len(ordered) // 2
    return ordered[mid]""", """    mid = len(ordered) // 2
    if len(ordered) % 2 == 0:
        return (ordered[mid - 1] + ordered[mid]) / 2
    return ordered[mid]""")
open("stats.py", "w").write(src)
PY
