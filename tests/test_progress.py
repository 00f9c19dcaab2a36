"""Progress bars: a widget bar interactively, plain text when a notebook runs headless (papermill)."""

from __future__ import annotations

import io

import pytest
from tqdm.std import tqdm as text_tqdm

from cosearch_lib import progress


@pytest.fixture
def interactive(monkeypatch):
    for name in progress.NO_WIDGET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    made = []

    def auto(*args, **kwargs):  # stands in for tqdm.auto's notebook bar
        made.append("widget")
        return text_tqdm(*args, **kwargs)

    monkeypatch.setattr(progress, "_auto_tqdm", auto)
    return made


def test_interactive_kernels_get_the_auto_bar(interactive):
    bar = progress.tqdm(total=3, file=io.StringIO())
    bar.close()
    assert interactive == ["widget"] and not progress.headless()


@pytest.mark.parametrize("name", progress.NO_WIDGET_ENV_VARS)
def test_headless_runs_get_plain_text_chosen_per_bar(interactive, monkeypatch, name):
    monkeypatch.setenv(name, "1")
    out = io.StringIO()
    with progress.tqdm(range(4), desc="encode", file=out, mininterval=0) as bar:
        for _ in bar:
            pass
    assert interactive == [] and type(bar) is text_tqdm and "encode" in out.getvalue() and "4/4" in out.getvalue()
    monkeypatch.setenv(name, "0")  # "0" means not headless: decided again at the next bar
    progress.tqdm(total=1, file=io.StringIO()).close()
    assert interactive == ["widget"]


def test_headless_bars_redraw_rarely_so_an_executed_notebook_keeps_a_few_lines_per_bar(interactive, monkeypatch):
    monkeypatch.setenv("PAPERMILL_EXECUTION", "1")
    out = io.StringIO()
    with progress.tqdm(range(500), desc="rollout", file=out) as bar:
        for _ in bar:
            pass
    assert bar.mininterval == progress.HEADLESS_MININTERVAL >= 10
    assert out.getvalue().count("rollout") <= 3  # start, end (and at most one redraw between)
