"""Fixtures for the chat-format tests: the default byte-level tokenizer and its format."""

from __future__ import annotations

import pytest

from looprl.chat import ChatFormat
from looprl.models.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(None)


@pytest.fixture(scope="session")
def fmt(tok):
    return ChatFormat(tok)
