"""Step 3 of the cluster path: the Fixed Ranker's relevance data (``cosearch prepare-relevance``).

The profile's ``relevance`` section says which training questions become queries (``split``,
``query_sources``, ``n_queries``); the profile's retriever (or the job's retrieval server,
:func:`~cosearch_lib.experiment.building.search_backend`) gives each its top-N
(``search.topn``); :func:`~cosearch_lib.retrieval.relevance_sets.prepare_relevance_set` labels them and
drops the queries with no relevant candidate, as the paper's appendix does. The relevance training
(``experiment.cached_starts.relevance_ranker``) then reads the file when ``relevance.source`` is
``"prepared"``.
"""

from __future__ import annotations

from typing import Any

from cosearch_lib.config import ProfileConfig
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.experiment.building import search_backend
from cosearch_lib.paths import project_relative
from cosearch_lib.retrieval.artifacts import corpus_paths, prepared_relevance_set, relevance_set_path, relevance_set_settings
from cosearch_lib.retrieval.relevance_sets import prepare_relevance_set, select_queries
from cosearch_lib.retrieval.retriever import SearchBackend


def prepare_relevance_data(cfg: ProfileConfig, retriever: SearchBackend | None = None, *, force: bool = False,
                           progress: bool = True) -> dict[str, Any]:
    """Write the profile's relevance set (see the module doc) unless it is already there with the same
    settings (``force``: write it again); returns its sidecar, with ``path`` and ``reused`` added."""
    cfg = cfg.for_starts()  # the relevance training's candidates are the starts' N (warmstart.topn)
    rc = cfg.relevance
    path = relevance_set_path(cfg)
    done = None if force else prepared_relevance_set(cfg)
    if done is not None:
        return {**done, "path": project_relative(path), "reused": True}
    qa = corpus_paths(cfg).qa
    if rc.split not in qa:
        raise ValueError(f"relevance.split: profile {cfg.profile!r} has no {rc.split!r} split; have {sorted(qa)}")
    examples = select_queries(load_qa(qa[rc.split]), sources=rc.query_sources, n=rc.n_queries, seed=cfg.seed)
    if not examples:
        raise ValueError(f"relevance.query_sources {list(rc.query_sources)}: no question of {project_relative(qa[rc.split])} "
                         "has one of these data_source values")
    if retriever is None:
        retriever = search_backend(cfg, progress=progress)
    summary = prepare_relevance_set(examples, retriever, cfg.search.topn, path, settings=relevance_set_settings(cfg),
                                    progress=progress)
    return {**summary, "path": project_relative(path), "reused": False}
