#!/bin/bash
cat > /app/text_utils.py <<'PY'
import re


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
PY
