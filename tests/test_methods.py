"""The methods registry: every training method is one named record, looked up by name, and adding
one is an entry (plus its code), not edits across the trainer, the wiring and the report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cosearch_lib.config import TrainConfig
from cosearch_lib.config.methods import METHODS, ROLES, TRAINING_METHODS, RankedBy, method_rows, method_spec
from cosearch_lib.eval.harness import EVAL_METHODS
from cosearch_lib.eval.method_settings import policy_eval_settings
from cosearch_lib.eval.paper_reference import PAPER_METHOD


def test_every_method_is_evaluated_by_a_harness_method_of_the_paper_row_it_claims():
    assert TRAINING_METHODS == ("search_r1", "fixed_ranker", "cosearch", "oracle")
    for name, spec in METHODS.items():
        assert spec.name == name and spec.eval_method in EVAL_METHODS
        assert PAPER_METHOD[spec.eval_method] == spec.paper_name  # the paper row of the evaluated policies
        assert "agent" in spec.trains and set(spec.trains) <= set(ROLES)
        assert ("ranker" in spec.warm_start) == spec.has_ranker_policy  # a frozen ranker starts warm too


def test_a_method_spec_decides_what_trains_and_what_ranks():
    assert method_spec("cosearch").trains_ranker and method_spec("cosearch").ranked_by is RankedBy.POLICY
    assert not method_spec("fixed_ranker").trains_ranker and method_spec("fixed_ranker").has_ranker_policy
    assert method_spec("oracle").ranked_by is RankedBy.ORACLE and not method_spec("oracle").has_ranker_policy
    assert method_spec("search_r1").evaluated_as("cross_encoder") == "agent_retrieval"
    assert method_spec("cosearch").evaluated_as("cross_encoder") == "agent_scorer"
    rows = method_rows(["oracle", "cosearch"])
    assert [r["method"] for r in rows] == ["oracle", "cosearch"] and rows[1]["trains"] == "agent, ranker"


def test_an_unknown_method_is_a_value_error_that_lists_the_methods():
    with pytest.raises(ValueError, match="training.method must be one of search_r1, fixed_ranker, cosearch, oracle, got .ppo."):
        method_spec("ppo")
    with pytest.raises(ValueError, match="ppo"):
        TrainConfig(method="ppo")


@pytest.mark.parametrize("method", TRAINING_METHODS)
def test_train_config_takes_roles_from_the_spec(method):
    spec, cfg = method_spec(method), TrainConfig(method=method)
    assert cfg.trainable() == {r for r in ("agent", "ranker") if spec.trains_role(r)}
    assert (cfg.roles()["ranker"] is not None) == spec.has_ranker_policy


def test_a_new_method_is_one_entry(monkeypatch):
    """A relevance-trained ranker that only the agent's trainer keeps frozen: one registry entry, and
    the config, the trainer's roles and the evaluation settings follow it with no other edit."""
    new = replace(METHODS["fixed_ranker"], name="frozen_policy_ranker", paper_name="Fixed Ranker")
    monkeypatch.setitem(METHODS, new.name, new)
    cfg = TrainConfig(method=new.name)
    assert cfg.trainable() == {"agent"} and cfg.roles() == {"agent": "agent", "ranker": "ranker"}
    settings = policy_eval_settings(new, {"agent": "a"}, fixed_ranker="w/ranker")
    assert settings == {"methods": ("agent_fixed_ranker",), "agent_adapter": "a", "fixed_ranker_adapter": "w/ranker"}


def test_policy_eval_settings_follow_the_spec_not_the_name():
    cosearch, fixed = method_spec("cosearch"), method_spec("fixed_ranker")
    assert policy_eval_settings(cosearch, {"agent": "a", "ranker": "r"}) == {
        "methods": ("agent_trained_ranker",), "agent_adapter": "a", "trained_ranker_adapter": "r"}
    assert policy_eval_settings(fixed, {"agent": "a", "ranker": "r"}, fixed_ranker="w")["fixed_ranker_adapter"] == "r"
    live = policy_eval_settings(cosearch, {"agent": "a", "scorer": None})  # the trainer's live scorer
    assert live == {"methods": ("agent_scorer",), "agent_adapter": "a", "scorer_model": None}
    assert policy_eval_settings(method_spec("oracle"), {"agent": "a", "ranker": "r"}) == {
        "methods": ("agent_oracle",), "agent_adapter": "a"}
