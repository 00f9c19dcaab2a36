"""Fixtures shared across test modules, and how the suite runs on several pytest-xdist workers
(`make test` and `make test-slow` run two): each worker's torch gets its share of the cores; in
`make test-slow` the test that builds the `ci` starts begins first; the `ci` world, index, warm start
and Fixed Ranker are built once, under a lock, by whichever worker needs them first."""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["tests.timeout_report"]  # a timeout fails one test, never the session

#: Started first (`make test-slow`): the longest test, which builds the ci starts that notebook 02's reads too
#: (on a fresh clone: a few minutes), while the other worker runs the rest.
FIRST = ("test_03_runs_on_ci_through_cosearch_run",)


def pytest_configure(config):
    """On an xdist worker, torch and the kernels and ranks it starts get cores / workers threads
    each: two 2-thread workers on 2 cores would each wait on the other's threads."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        threads = str(max(1, (os.cpu_count() or 1) // int(workers)))
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))


def pytest_collection_modifyitems(config, items):
    """FIRST at the front, the rest in file order (xdist's worksteal hands the two halves of this
    order to two workers, and a worker that is done takes from the other's)."""
    items.sort(key=lambda item: 0 if item.name in FIRST else 1)


@pytest.fixture(scope="session")
def ci_index():
    """The ``ci`` world and index, built once under a lock (``atomic_io.build_lock``): another
    worker building them at the same time waits, then loads them. Cached under data/."""
    from cosearch_lib.atomic_io import build_lock
    from cosearch_lib.config import load_profile
    from cosearch_lib.experiment import build_retriever
    from cosearch_lib.paths import cache_dir

    cfg = load_profile("ci")
    with build_lock(cache_dir() / "ci-tests"):
        return cfg, build_retriever(cfg, progress=False)


@pytest.fixture(scope="session")
def ci_agent_start(ci_index):
    """The ``ci`` warm-started agent, built once per machine before a notebook needs it, so that a
    fresh clone's build counts against no cell's timeout (a busy machine once took notebook 02's
    warm-start cell past it) and two workers never train it side by side. Notebook 02's test reads
    nothing else: its methods leave out the Fixed Ranker (~2 min of ``make test-slow`` less)."""
    from cosearch_lib.atomic_io import build_lock
    from cosearch_lib.experiment import warm_start
    from cosearch_lib.paths import cache_dir

    cfg, retriever = ci_index
    with build_lock(cache_dir() / "ci-tests"):
        return warm_start(cfg, retriever, roles=("agent",), progress=False)


@pytest.fixture(scope="session")
def ci_starts(ci_index):
    """The ``ci`` warm start of both roles and the Fixed Ranker (notebook 03's starts), built once
    under the same lock, before the runs that read them start side by side."""
    from cosearch_lib.atomic_io import build_lock
    from cosearch_lib.experiment import fixed_ranker, warm_start
    from cosearch_lib.paths import cache_dir

    cfg, retriever = ci_index
    with build_lock(cache_dir() / "ci-tests"):
        fixed_ranker(cfg, retriever, progress=False)
        return warm_start(cfg, retriever, progress=False)


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
