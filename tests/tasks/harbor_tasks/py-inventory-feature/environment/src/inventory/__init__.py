"""A tiny inventory."""
