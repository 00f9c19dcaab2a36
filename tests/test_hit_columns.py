"""Hit columns named for the K they measure (issue 49, item 5): the cutoffs come from the profile's
``training.ranker_reward.hit_ks``, a cutoff at or above K reads ``hit@K``, and records written when
the columns were ``hit@1/3/5`` are read under today's names."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cosearch_lib.config import load_profile
from cosearch_lib.eval.harness import record_columns
from cosearch_lib.experiment import harness_config
from cosearch_lib.metrics import hit_cutoffs, shown_hits
from cosearch_lib.run_schema import current_step_columns, describe_step_metric, hit_names, under_current_names


def test_cutoffs_at_or_above_k_become_hit_at_k():
    assert hit_cutoffs((1, 3, 5), 2) == (1, 2) and hit_names((1, 3, 5), 2) == ["hit@1", "hit@K"]
    assert hit_cutoffs((1, 3, 5), 3) == (1, 3) and hit_names((1, 3, 5), 3) == ["hit@1", "hit@K"]
    assert hit_cutoffs((5, 1, 3), 5) == (1, 3, 5) and hit_names((1, 3, 5), 5) == ["hit@1", "hit@3", "hit@K"]
    assert hit_names((1, 3, 5), 10) == ["hit@1", "hit@3", "hit@5", "hit@K"]  # K = 10: the whole list is a column of its own
    assert shown_hits([0, 1], (1, 3, 5), 2) == {"hit@1": 0.0, "hit@K": 1.0}
    assert shown_hits([0, 0, 1, 0, 0], (1, 3, 5), 5) == {"hit@1": 0.0, "hit@3": 1.0, "hit@K": 1.0}
    with pytest.raises(ValueError, match="every k in ks"):
        hit_cutoffs((0, 3), 5)


def test_evaluation_columns_follow_the_profile():
    demo, paper = harness_config(load_profile("demo")), harness_config(load_profile("paper"))
    assert [c for c in demo.record_columns() if "hit" in c] == ["ranker_hit@1", "ranker_hit@K"]  # K = 2
    assert [c for c in paper.record_columns() if "hit" in c] == ["ranker_hit@1", "ranker_hit@3", "ranker_hit@K"]  # K = 5
    assert record_columns((2,), 5)[record_columns((2,), 5).index("ranker_hit@2") + 1] == "ranker_hit@K"
    nothing = demo.shown_hits(None)
    assert list(nothing) == ["ranker_hit@1", "ranker_hit@K"] and all(math.isnan(v) for v in nothing.values())


def test_old_hit_columns_are_read_under_todays_names():
    # K = 2: the old hit@3 and hit@5 both measured the whole list; hit@3 goes, hit@5 is hit@K
    k2 = pd.DataFrame({"ranker_hit@1": [0.0, 1.0], "ranker_hit@3": [1.0, float("nan")], "ranker_hit@5": [1.0, float("nan")]})
    assert list(under_current_names(k2).columns) == ["ranker_hit@1", "ranker_hit@K"]
    # K = 5: hit@3 told something hit@5 did not; it stays
    k5 = pd.DataFrame({"hit@1": [0.0, 0.0], "hit@3": [0.0, 1.0], "hit@5": [1.0, 1.0]})
    assert list(under_current_names(k5).columns) == ["hit@1", "hit@3", "hit@K"]
    step = {"step": 3, "val_ranker_hit@1": 0.5, "val_ranker_hit@3": 0.75, "val_ranker_hit@5": 0.75}
    assert current_step_columns(step) == {"step": 3, "val_ranker_hit@1": 0.5, "val_ranker_hit@K": 0.75}
    today = pd.DataFrame({"hit@1": [0.0], "hit@3": [0.0], "hit@K": [0.0]})  # K = 5, written today: nothing renamed or dropped
    assert list(under_current_names(today).columns) == ["hit@1", "hit@3", "hit@K"]


def test_every_hit_column_has_a_glossary_entry():
    for name in ("val/ranker_hit@1", "val/ranker_hit@3", "val/ranker_hit@K", "ranker/hit@K"):
        assert describe_step_metric(name)
