"""Score slugify() case by case; write the reward and the metrics to /logs/verifier/reward.json."""
import json
import sys

sys.path.insert(0, "/app")
CASES = [("  Hello, World!  ", "hello-world"), ("already-a-slug", "already-a-slug"),
         ("Ünïcode & Co", "n-code-co"), ("--x--", "x"), ("A1 B2", "a1-b2"), ("", "")]
passed = 0
try:
    from text_utils import slugify
    for given, want in CASES:
        try:
            got = slugify(given)
        except Exception as e:  # noqa: BLE001
            got = f"<{type(e).__name__}>"
        ok = got == want
        passed += ok
        print(("PASS" if ok else "FAIL"), repr(given), "->", repr(got), "want", repr(want))
except Exception as e:  # noqa: BLE001
    print("import failed:", e)
json.dump({"reward": 1.0 if passed == len(CASES) else 0.0, "cases_passed": passed,
           "cases_total": len(CASES)}, open("/logs/verifier/reward.json", "w"))
