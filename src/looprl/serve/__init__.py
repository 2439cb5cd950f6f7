"""looprl.serve: the agent behind an HTTP API for users (``api.make_app``), recording their
feedback in ``looprl.feedback``'s store; ``looprl serve`` (``cli.py``) runs it."""

from looprl.serve.api import ServeConfig, make_app

__all__ = ["ServeConfig", "make_app"]
