"""``looprl search index|query``: the ``search_app`` of ``looprl.search.cli`` exposed as ``app``,
so the top-level CLI can wire it like every other sub-app (``("search", "looprl.search.search_cli",
...)``)."""

from looprl.search.cli import search_app as app

__all__ = ["app"]
