"""looprl.serve: the agent behind an HTTP API for users (``api.make_app``), recording their
feedback in ``looprl.feedback``'s store; ``looprl serve`` (``looprl.commands.serve``) runs it."""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "api": ["ServeConfig", "make_app"],
})
