"""The inference choices a config names, without torch (a config is checked before torch
loads); ``looprl.inference.spec`` checks an engine's choice against them."""

MODES = ("auto", "on", "off")
"""``model.experimental.speculative``: auto (per batch size, where it measures faster), on, off."""
