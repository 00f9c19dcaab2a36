"""Fixtures shared across test modules."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.timeout_report"]  # a timeout fails one test, never the session


@pytest.fixture(scope="session")
def tok():
    """SmolLM2's tokenizer (converted once into data/cache, then ~1 s to load)."""
    from cosearch_lib.models.registry import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def chat(tok):
    from cosearch_lib.agent.chat_tokens import ChatTokens

    return ChatTokens(tok)


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew, so that the suite never holds more than one test's figures."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
