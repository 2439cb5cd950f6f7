"""A Harbor task directory whose environment is a prebuilt image (``docker_image``), for
tests/tasks/test_harbor_image.py: its verifier files are Harbor's, so pytest collects nothing
below here."""

collect_ignore_glob = ["*"]
