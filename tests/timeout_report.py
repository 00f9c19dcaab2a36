"""A pytest plugin (loaded by conftest.py): a test stopped by pytest-timeout fails with the timeout's
message alone, without a traceback. The timeout's signal can land anywhere, including inside the
interpreter's own parser; pytest's usual traceback then re-parses source files and can crash the
whole session (INTERNALERROR "AST constructor recursion depth mismatch", seen on a busy machine).
pytest-timeout has already printed every thread's stack to stderr, so nothing is lost."""

from __future__ import annotations

import pytest

TIMEOUT_MESSAGE = "from pytest-timeout"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except pytest.fail.Exception as err:
        if TIMEOUT_MESSAGE in str(err) and err.pytrace:
            pytest.fail(f"{item.nodeid}: {err}", pytrace=False)
        raise
