"""The ranker kinds' registry (config.RANKER_KINDS, experiment.RANKER_STARTS) and the scoring ranker's
one slot (run_schema.SCORER_SLOT), with the names older records and checkpoints used for it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from cosearch_lib.agent.rankers import RANKING_MODES
from cosearch_lib.config import RANKER_KINDS, SCORING_RANKER_KINDS, TrainConfig, ranker_kind
from cosearch_lib.eval.harness import EVAL_METHODS as HARNESS_METHODS
from cosearch_lib.eval.tables import load_records
from cosearch_lib.experiment import RANKER_STARTS
from cosearch_lib.run_schema import RENAMED_STEP_COLUMNS, SCORER_SLOT, STAT_PREFIXES, renamed_slots

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(RANKER_KINDS))
def test_every_ranker_kind_has_a_start_a_ranking_mode_an_evaluation_and_its_settings(name):
    kind = ranker_kind(name)
    assert kind.name == name and name in RANKER_STARTS  # its start: folder, builder, cache check
    assert kind.ranking_mode in RANKING_MODES
    assert kind.evaluated_as is None or kind.evaluated_as in HARNESS_METHODS
    assert kind.settings is None or kind.settings in {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(method="cosearch", ranker_kind=name)
    assert cfg.uses_scoring_ranker == kind.scoring == (name in SCORING_RANKER_KINDS)
    assert (cfg.roles()["ranker"] is None) == kind.scoring  # a scoring ranker is no LoRA role
    if kind.scoring:
        lr, head_lr = cfg.scoring_ranker_lr
        settings = getattr(cfg, kind.settings)
        assert lr == settings.lr and head_lr == getattr(settings, "head_lr", None)


def test_the_registries_name_the_same_kinds_and_an_unknown_kind_is_refused_by_name():
    assert set(RANKER_STARTS) == set(RANKER_KINDS)
    with pytest.raises(KeyError, match="llm_judge"):
        ranker_kind("bm25")


def test_a_scoring_ranker_travels_in_one_slot_and_older_records_come_back_under_it():
    assert SCORER_SLOT in STAT_PREFIXES
    old = {"agent": "a", "cross_encoder": {"model": 1}}
    assert renamed_slots(old) == {"agent": "a", SCORER_SLOT: {"model": 1}}
    assert RENAMED_STEP_COLUMNS["cross_encoder_grad_norm"] == f"{SCORER_SLOT}_grad_norm"
    assert RENAMED_STEP_COLUMNS["cross_encoder_update_s"] == f"{SCORER_SLOT}_update_s"
    # evaluation records written when the harness method was named for the cross-encoder
    path = ROOT / "docs/log_records/2026-11-27-laptop-seed0/03_eval_records.csv"
    assert "agent_cross_encoder" in path.read_text()
    methods = set(load_records(path)["eval_method"])
    assert "agent_scorer" in methods and "agent_cross_encoder" not in methods


def test_an_evaluations_key_is_the_one_it_had_before_the_scoring_ranker_was_renamed():
    """Parts of an evaluation written before the rename are found again (resumed jobs, requeues):
    the key hashes the settings under the names they were written with. The two keys were computed
    at the commit before the rename (cba3e26) with the same settings."""
    from cosearch_lib.eval.harness import HarnessConfig
    from cosearch_lib.experiment.evaluation_shards import evaluation_key

    assert evaluation_key("x", HarnessConfig(methods=("agent_trained_ranker",))) == "f2df4a47ade6"
    assert evaluation_key("x", HarnessConfig(methods=("agent_scorer",))) == "d86b835c3a8f"  # was agent_cross_encoder
    with pytest.raises(ValueError, match="now named 'agent_scorer'"):
        HarnessConfig(methods=("agent_cross_encoder",))


def test_every_reader_of_records_gives_todays_names_for_a_run_written_before_the_rename():
    """The committed CoSearch curve of issue 48 was written before the scorer slot's rename: its step
    columns come back renamed through compare-runs' reader and the training-run reader alike."""
    from cosearch_lib.records.compare import read_any_table

    path = ROOT / "docs/log_records/2026-11-28-issue48-third-session/cosearch_steps.csv"
    assert "cross_encoder_grad_norm" in path.read_text().splitlines()[0]
    table = read_any_table(path)
    assert {"loss/scorer_grad_norm", "time/scorer_update_s"} <= set(table.columns)
    assert not [c for c in table.columns if c.startswith("cross_encoder")]
    assert table["loss/scorer_grad_norm"].notna().any() and set(table["method"]) == {"cosearch"}
