"""Sandboxes: isolated copy-on-write workspaces (see ``workspace.py``, ``bwrap.py``, ``pool.py``).

Contract used by the rest of looprl (implemented in this package):

    sandbox = await create_sandbox(base_dir, venv=None)   # -> looprl.protocols.Sandbox
    ...
    await sandbox.close()
"""
