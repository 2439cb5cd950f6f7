"""Every ``looprl`` sub-command, one module per command group, wired by ``looprl.cli``.

Commands are composition roots: they parse options, build configs and call into the packages
below, so they sit at the top of the layering and no package imports them. Heavy imports
(torch, transformers, servers) stay inside the command functions so ``looprl --help`` is fast.
"""
