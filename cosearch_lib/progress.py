"""Progress bars that read well wherever the code runs.

``tqdm.auto`` draws an ipywidgets bar inside any Jupyter kernel. Under papermill that bar is saved
as widget state in the executed notebook, which shows a bar frozen at 0% until the notebook is
trusted, not the progress that happened. So every module of the library takes its ``tqdm`` from
here: the widget bar in an interactive kernel, plain text (``tqdm.std``) when the notebook runs
headless, i.e. when one of :data:`NO_WIDGET_ENV_VARS` is set (the papermill runner sets
``PAPERMILL_EXECUTION``; ``COSEARCH_NO_WIDGETS`` does it by hand). The choice is made per bar, so
a kernel that sets the variable later is honoured.
"""

from __future__ import annotations

import os
from typing import Any

from tqdm.auto import tqdm as _auto_tqdm
from tqdm.std import tqdm as _text_tqdm

#: Environment variables that switch widgets off (any value but "", "0", "false", "no").
NO_WIDGET_ENV_VARS = ("COSEARCH_NO_WIDGETS", "PAPERMILL_EXECUTION")
#: Seconds between redraws of a headless (plain-text) bar.
HEADLESS_MININTERVAL = 15.0


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")


def headless() -> bool:
    """True when a :data:`NO_WIDGET_ENV_VARS` variable asks for text instead of widgets."""
    return any(_truthy(os.environ.get(name)) for name in NO_WIDGET_ENV_VARS)


def tqdm(*args: Any, **kwargs: Any):
    """A progress bar: ``tqdm.auto`` interactively, plain-text ``tqdm.std`` when :func:`headless`.
    Headless bars redraw at most every :data:`HEADLESS_MININTERVAL` seconds: each redraw becomes a
    line of the executed notebook's output, so a bar prints its start, a few updates and its end."""
    if headless():
        kwargs.setdefault("mininterval", HEADLESS_MININTERVAL)
        return _text_tqdm(*args, **kwargs)
    return _auto_tqdm(*args, **kwargs)
