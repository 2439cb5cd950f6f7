"""Harbor task directories written for looprl's tests (tests/tasks/test_harbor.py): their
verifier files are Harbor's (``tests/test_outputs.py`` run by ``tests/test.sh``), not looprl's
tests, so pytest collects nothing below here."""

collect_ignore_glob = ["*"]
