"""Profiles: the committed profiles load, typos and wrong types are caught by name."""

from __future__ import annotations

import json

import pytest

from cosearch_lib.config import ConfigError, ProfileConfig, available_profiles, from_dict, load_profile, papermill_parameters


@pytest.mark.parametrize("name", ["ci", "demo"])
def test_committed_profiles_load(name):
    cfg = load_profile(name)
    assert cfg.profile == name and cfg.uses_embedded_world
    assert 1 <= cfg.search.topk <= cfg.search.topn


def test_profiles_are_listed_and_demo_is_bigger_than_ci():
    assert {"ci", "demo"} <= set(available_profiles())
    ci, demo = load_profile("ci"), load_profile("demo")
    assert ci.world.n_train_questions < demo.world.n_train_questions
    assert ci.fingerprint("world") != demo.fingerprint("world")


def test_unknown_key_is_an_error_naming_it(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("profile: typo\nsearch:\n  topn: 20\n  top_k: 5\n")
    with pytest.raises(ConfigError, match=r"search: unknown key\(s\) \['top_k'\]"):
        load_profile(p)


def test_wrong_types_and_ranges_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="search.topn: expected int"):
        from_dict(ProfileConfig, {"search": {"topn": "fifty"}})
    with pytest.raises(ConfigError, match="seed: expected int, got a boolean"):
        from_dict(ProfileConfig, {"seed": True})
    with pytest.raises(ConfigError, match="search.topk <= search.topn"):
        from_dict(ProfileConfig, {"search": {"topn": 3, "topk": 5}})
    with pytest.raises(ConfigError, match="encoder: .*pooling"):
        from_dict(ProfileConfig, {"retrieval": {"encoder": {"pooling": "max"}}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile(bad)


def test_missing_profile_lists_the_available_ones():
    with pytest.raises(ConfigError, match="available profiles: .*'ci'"):
        load_profile("no-such-profile")


def test_overrides_and_papermill_parameters():
    assert load_profile("ci", seed=7).seed == 7
    assert load_profile("ci", seed=None).seed == load_profile("ci").seed  # None = keep the file's value
    params = papermill_parameters("ci")
    assert params["profile"] == "ci" and all(not isinstance(v, (dict, list)) for v in params.values())


def test_fingerprint_is_stable_and_sectioned():
    a, b = load_profile("ci"), load_profile("ci")
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 12
    b.search.topk = 3
    assert a.fingerprint("world") == b.fingerprint("world") and a.fingerprint() != b.fingerprint()


def test_one_search_budget_is_shared_by_reference():
    cfg = from_dict(ProfileConfig, {"search": {"topn": 20, "topk": 3, "max_searches": 2}})
    assert cfg.rollout.search is cfg.search and cfg.protocol.search is cfg.search
    cfg.search.topk = 4  # one edit reaches every stage
    assert (cfg.rollout.search.topk, cfg.protocol.search.topk) == (4, 4)
    for section in ("rollout", "protocol"):  # a second home for N, K or the cap is refused by name
        with pytest.raises(ConfigError, match=f"{section}.search: set in the profile's top-level 'search:'"):
            from_dict(ProfileConfig, {section: {"search": {"topk": 4}}})
    for old in ({"retrieval": {"topk": 3}}, {"rollout": {"max_searches": 2}}, {"protocol": {"max_search_turns": 2}}):
        with pytest.raises(ConfigError, match="unknown key"):
            from_dict(ProfileConfig, old)
    with pytest.raises(ConfigError, match="models.backend must be"):
        from_dict(ProfileConfig, {"models": {"backend": "tgi"}})
    with pytest.raises(ConfigError, match="models.compile_decode: expected bool or null"):
        from_dict(ProfileConfig, {"models": {"compile_decode": "fast"}})
    cfg = from_dict(ProfileConfig, {"models": {"compile_decode": True, "batch_size": 3}})
    assert cfg.models.transformers_options() == {"batch_size": 3, "compile_decode": True}
    assert from_dict(ProfileConfig, {}).models.compile_decode is None  # default: the backend decides (on a GPU only)
    # a speed-only option leaves cache keys (warm starts, worlds) alone; a real setting moves them
    plain = from_dict(ProfileConfig, {"models": {"batch_size": 3}})
    assert cfg.fingerprint() == plain.fingerprint() and cfg.fingerprint("models") == plain.fingerprint("models")
    assert from_dict(ProfileConfig, {"models": {"batch_size": 4}}).fingerprint("models") != plain.fingerprint("models")
    assert json.dumps(plain.to_dict(), sort_keys=True, default=str).count("compile_decode") == 1  # still recorded


def test_protocol_and_training_sections_follow_their_homes(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("search: {topn: 10, topk: 3, max_searches: 2}\n"
                    "protocol: {max_passage_chars: 300}\ntraining: {method: oracle, grouping: {k_min: 4}, "
                    "ranker_reward: {variant: released, hit_ks: [1, 3]}}\nlora: {r: 8, target_modules: [q_proj]}\n")
    cfg = load_profile(path)
    assert (cfg.protocol.search.topk, cfg.protocol.search.max_searches, cfg.protocol.max_passage_chars) == (3, 2, 300)
    assert cfg.training.method == "oracle" and cfg.training.grouping.k_min == 4
    assert cfg.training.ranker_reward.hit_ks == (1, 3) and cfg.lora.target_modules == ("q_proj",)
    path.write_text("training: {method: ppo}\n")
    with pytest.raises(ConfigError, match="method"):
        load_profile(path)


def test_extends_merges_sections_and_refuses_loops(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("profile: base\nseed: 3\nsearch:\n  topn: 12\n  topk: 3\ntraining:\n  steps: 4\n  group_size: 4\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {base}\nprofile: child\ntraining:\n  steps: 9\n")
    cfg = load_profile(child)
    assert (cfg.profile, cfg.seed, cfg.search.topn, cfg.search.topk) == ("child", 3, 12, 3)
    assert (cfg.training.steps, cfg.training.group_size) == (9, 4)  # one key replaced, its neighbour inherited
    assert papermill_parameters(child) == {"profile": "child", "seed": 3}  # "extends" is not a parameter
    same = load_profile(base)
    assert cfg.fingerprint("search") == same.fingerprint("search")  # shared sections: shared caches (warm start)
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"extends: {loop}\nprofile: loop\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_profile(loop)
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: [a, b]\n")
    with pytest.raises(ConfigError, match="names one profile"):
        load_profile(bad)


def test_laptop_profile_reuses_the_demo_warm_start():
    demo, laptop = load_profile("demo"), load_profile("laptop")
    shaping = ("world", "data", "retrieval", "search", "protocol", "models", "warmstart", "lora", "seed")
    assert laptop.fingerprint(*shaping) == demo.fingerprint(*shaping)
    assert laptop.evaluation.n_per_dataset > demo.evaluation.n_per_dataset
    assert laptop.training.steps > demo.training.steps
