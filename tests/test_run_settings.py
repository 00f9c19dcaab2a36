"""The settings a notebook shows: a short table of what decides the numbers, not the whole config."""

from __future__ import annotations

from cosearch_lib.config import load_profile
from cosearch_lib.experiment import harness_config
from cosearch_lib.records.run_settings import evaluation_settings, training_settings


def test_training_settings_name_the_budget_the_methods_share():
    cfg = load_profile("laptop")
    table = training_settings(cfg, ["search_r1", "cosearch"], steps=6)
    v = table["value"]
    assert len(table) <= 15 and table.index.is_unique
    assert v["methods"] == "search_r1, cosearch"
    assert v["GRPO steps x questions x G"] == f"6 x {cfg.training.questions_per_step} x {cfg.training.group_size}"
    assert v["N candidates / K shown / search cap"] == f"{cfg.search.topn} / {cfg.search.topk} / {cfg.search.max_searches}"
    assert v["learning rate agent / ranker"] == f"{cfg.training.agent_lr:g} / {cfg.training.ranker_lr:g}"
    assert v["Fixed Ranker"].startswith("relevance-trained")
    assert "Fixed Ranker" not in training_settings(load_profile("demo"), ["cosearch"]).index  # no relevance training
    assert "RuleSet" not in table.to_string()  # no config reprs


def test_evaluation_settings_say_how_answers_are_scored():
    cfg = load_profile("ci")
    table = evaluation_settings(cfg, harness_config(cfg, methods=["direct", "agent_oracle"]))
    v = table["value"]
    assert v["methods"] == "direct, agent_oracle" and v["decoding"] == "greedy" and v["answer F1"] == "plain"
    assert v["split, questions per family"] == f"test, {cfg.evaluation.n_per_dataset}"


def test_every_profile_states_what_it_can_and_cannot_show_and_notebooks_say_it():
    import json

    from cosearch_lib.config import available_profiles
    from cosearch_lib.paths import notebooks_dir
    from cosearch_lib.records.run_settings import profile_scope

    for name in available_profiles():
        cfg = load_profile(name)
        assert cfg.scope.shows and cfg.scope.cannot_show, name
        text = profile_scope(cfg)
        assert text.startswith(f"**Profile `{cfg.profile}`** can show ") and "It cannot show" in text
    assert "plumbing check" in load_profile("ci").scope.cannot_show
    for book in sorted(notebooks_dir().glob("*.ipynb")):
        cells = json.loads(book.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert "profile_scope(cfg)" in "".join(code[2]["source"]), book.name  # right under the setup cell
