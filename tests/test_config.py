"""Profiles: the committed profiles load, typos and wrong types are caught by name."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from cosearch_lib.config import (
    RULE_SETS,
    AgentRewardConfig,
    ConfigError,
    EvaluationConfig,
    GroupingConfig,
    GRPOConfig,
    LoraSettings,
    ProfileConfig,
    ProtocolConfig,
    RankerRewardConfig,
    RolloutConfig,
    RuleSet,
    SamplingConfig,
    SearchBudget,
    ServerConfig,
    SlurmConfig,
    TrainConfig,
    WarmStartConfig,
    WorldConfig,
    available_profiles,
    from_dict,
    load_profile,
    papermill_parameters,
)


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
    with pytest.raises(ConfigError, match=r"^retrieval\.encoder\.pooling must be one of 'mean', 'cls', got 'max'$"):
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
    b.search.topk = a.search.topk + 1
    assert a.fingerprint("world") == b.fingerprint("world") and a.fingerprint() != b.fingerprint()


def test_the_starts_n_keys_the_starts_as_the_profile_of_that_n_and_leaves_other_keys_as_they_were():
    """``warmstart.topn``: a profile that changes N for GRPO and the evaluation alone builds its starts
    (``ProfileConfig.for_starts``) at the N they were trained at, so they share that profile's cache keys."""
    from cosearch_lib.experiment.cached_starts import llm_judge_dir, relevance_dir, warmstart_dir

    ten = load_profile("laptop")
    assert ten.warmstart.topn is None and ten.for_starts() is ten
    from cosearch_lib.config.profile import _fingerprinted
    assert "topn" not in _fingerprinted(ten)["warmstart"]  # unset: the keys of the caches made before it are kept
    assert _fingerprinted(load_profile("laptop_n20"))["warmstart"]["topn"] == 10
    wide = ten.with_search(topn=20)
    assert (wide.search.topn, wide.protocol.search, wide.rollout.search) == (20, wide.search, wide.search)
    assert wide.rollout.search is wide.search and ten.search.topn == 10  # a copy: the profile is untouched
    assert warmstart_dir(wide) != warmstart_dir(ten)  # N shapes the gold sequences (answer passages promoted from N)
    n20 = load_profile("laptop_n20")
    assert (n20.search.topn, n20.warmstart.topn) == (20, 10)
    starts = n20.for_starts()
    assert (starts.search.topn, starts.warmstart.topn, starts.rollout.search.topn) == (10, None, 10)
    for key in (warmstart_dir, llm_judge_dir, relevance_dir):
        assert key(n20) == key(ten)
    assert n20.fingerprint("search") != ten.fingerprint("search")  # GRPO's and the evaluation's N is its own
    with pytest.raises(ConfigError, match="warmstart.topn must be at least search.topk = 2"):
        from_dict(ProfileConfig, {"search": {"topn": 20, "topk": 2}, "warmstart": {"topn": 1}})


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


def test_laptop_profile_extends_demo_with_a_larger_warm_start_and_the_fixed_ranker():
    demo, laptop = load_profile("demo"), load_profile("laptop")
    shaping = ("world", "data", "retrieval", "search", "protocol", "lora", "seed")
    assert laptop.fingerprint(*shaping) == demo.fingerprint(*shaping)
    # the same models; laptop generates 32 prompts per forward pass (its 140-question evaluations)
    assert dataclasses.replace(laptop.models, batch_size=demo.models.batch_size) == demo.models
    assert laptop.models.batch_size > demo.models.batch_size
    assert laptop.warmstart.epochs > demo.warmstart.epochs and laptop.relevance.enabled and not demo.relevance.enabled
    assert laptop.evaluation.n_per_dataset > demo.evaluation.n_per_dataset
    assert laptop.training.steps > demo.training.steps
    seed1 = load_profile("laptop_seed1")  # the second seed: every setting but the seed is laptop's
    sections = [f.name for f in dataclasses.fields(laptop) if f.name not in ("seed", "profile")]
    assert seed1.seed == 1 and seed1.fingerprint(*sections) == laptop.fingerprint(*sections)
    assert seed1.fingerprint("world") == laptop.fingerprint("world")  # the same world and test questions


def test_the_multi_hop_probe_is_laptop_curve_bf16_on_multi_hop_training_questions_alone():
    """laptop_curve_multi (issue 48, item 2): only the training mix differs from laptop_curve_bf16, so its
    multi-hop validation row reads beside that run's; the starts and the validation questions are the same."""
    from cosearch_lib.eval.benchmark_families import in_families
    from cosearch_lib.experiment.cached_starts import warmstart_dir

    probe, base = load_profile("laptop_curve_multi"), load_profile("laptop_curve_bf16")
    assert dataclasses.replace(probe.training, families=()) == base.training
    assert warmstart_dir(probe) == warmstart_dir(base) and probe.fingerprint("world") == base.fingerprint("world")
    kept = [f for f in ("syn_nq", "syn_triviaqa", "syn_popqa", "syn_hotpotqa", "syn_2wiki", "syn_musique", "syn_bamboogle")
            if in_families(f, probe.training.families)]
    assert kept == ["syn_hotpotqa", "syn_2wiki", "syn_musique", "syn_bamboogle"]


# ------------------------------------------------------------------------------ one error type, naming the key


@pytest.mark.parametrize("build, message", [
    (lambda: SearchBudget(topn=0), "search.topn must be an integer >= 1, got 0"),
    (lambda: SearchBudget(topk=True), "search.topk must be an integer >= 1, got True"),
    (lambda: WorldConfig(n_people=5), "world.n_people must be an integer >= 6 (two per component), got 5"),
    (lambda: WorldConfig(spouse_rate=1.5), "world.spouse_rate must be a finite number in [0, 1], got 1.5"),
    (lambda: ServerConfig(port=70000), "server.port must be an integer in [0, 65535] (0 picks a free port), got 70000"),
    (lambda: ServerConfig(default_topk=200), "server.default_topk must be <= server.max_topk (100), got 200"),
    (lambda: SamplingConfig(top_p=0), "SamplingConfig.top_p must be a finite number in (0, 1], got 0"),
    (lambda: LoraSettings(dropout=1.0), "lora.dropout must be a finite number in [0, 1), got 1.0"),
    (lambda: ProtocolConfig(max_observation_chars=10), "protocol.max_observation_chars must be an integer >= 30 "
                                                       "(room for the <information> tags and one character), got 10"),
    (lambda: GRPOConfig(clip_eps=1.5), "training.grpo.clip_eps must be a finite number in (0, 1), got 1.5"),
    (lambda: GRPOConfig(kl_coef=float("nan")), "training.grpo.kl_coef must be a finite number >= 0, got nan"),
    (lambda: AgentRewardConfig(alpha=-0.1), "training.agent_reward.alpha must be a finite number >= 0 (a penalty size), got -0.1"),
    (lambda: RankerRewardConfig(hit_ks=(0, 3)), "training.ranker_reward.hit_ks must be a non-empty sequence of integers >= 1, "
                                                "got (0, 3)"),
    (lambda: GroupingConfig(k_min=2.5), "training.grouping.k_min must be an integer >= 1 or null, got 2.5"),
    (lambda: GroupingConfig(dedupe_identical=1), "training.grouping.dedupe_identical must be a bool or null, got 1"),
    (lambda: TrainConfig(group_size=1), "training.group_size must be an integer >= 2 (GRPO compares samples), got 1"),
    (lambda: TrainConfig(log_to=("mlflow",)), "training.log_to: unknown tracker kind(s) ['mlflow']; expected any of "
                                              "('tensorboard', 'wandb')"),
    (lambda: WarmStartConfig(epochs=0), "warmstart.epochs must be a finite number > 0, got 0"),
    (lambda: SlurmConfig(extra=("constraint=a100",)), "slurm.extra must be one sbatch option starting with '--' per entry, "
                                                      "got 'constraint=a100'"),
    (lambda: EvaluationConfig(f1="em"), "evaluation.f1 must be one of 'plain', 'yes_no', got 'em'"),
    (lambda: RuleSet(zero_variance="approx"), "rules.zero_variance must be one of 'tolerance', 'exact', got 'approx'"),
    (lambda: TrainConfig(rules="verl"), "rules must be one of 'paper', 'released', got 'verl'"),
])
def test_every_bad_value_is_a_config_error_naming_the_key_the_value_and_what_is_allowed(build, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$") as err:
        build()
    assert isinstance(err.value, ValueError)  # `except ValueError` still catches it


def test_a_profile_error_is_the_section_error_under_the_file_name(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("training: {grpo: {clip_eps: 1.5}}\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: training\\.grpo\\.clip_eps must be a finite number "
                                          r"in \(0, 1\), got 1\.5$"):
        load_profile(path)


# ------------------------------------------------------------------------------ shared objects, given by construction


@pytest.mark.parametrize("name", ["paper", "released"])
def test_a_config_built_alone_gets_the_rules_a_profile_gives_it(name):
    rules = RULE_SETS[name]
    profile = from_dict(ProfileConfig, {"rules": name})
    alone = TrainConfig(rules=name)
    assert alone == profile.training == TrainConfig(rules=rules) and RolloutConfig(rules=name) == profile.rollout
    assert alone.rules is rules and profile.rollout.rules is rules
    assert all(getattr(alone, s).rules is rules for s in ("agent_reward", "ranker_reward", "grouping"))

    def resolved(t):  # not fields, so == above does not compare them
        return (t.agent_reward.uses_yes_no_rule, t.ranker_reward.form, t.ranker_reward.format_fail_policy,
                t.ranker_reward.invalid_penalized, t.grouping.min_size, t.grouping.dedupe)
    assert resolved(alone) == resolved(profile.training)
    assert resolved(alone)[1] == ("released" if name == "released" else "paper")
    # nested sections written in a profile equal the same sections built by hand with the rule set
    written = from_dict(ProfileConfig, {"rules": name, "training": {"steps": 3, "grouping": {"k_min": 2},
                                                                    "ranker_reward": {"hit_ks": [1, 3]}}})
    by_hand = TrainConfig(rules=name, steps=3, grouping=GroupingConfig(k_min=2, rules=name),
                          ranker_reward=RankerRewardConfig(hit_ks=(1, 3), rules=rules))
    assert written.training == by_hand and written.training.grouping.rules is rules
    # sections built by hand make the same profile, and are taken as given (never edited)
    again = ProfileConfig(rules=name, training=by_hand, rollout=RolloutConfig(rules=name))
    assert again == written and again.training is by_hand and again.rollout.search is again.search
    assert again.fingerprint() == written.fingerprint()
    # a copy with other settings (experiment.build_trainer) keeps the rule set
    assert dataclasses.replace(profile.training, steps=5).grouping.rules is rules


def test_a_nested_config_with_another_rule_set_or_budget_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^training\.grouping\.rules must be training's rule set 'released', got 'paper'"):
        TrainConfig(rules="released", grouping=GroupingConfig(k_min=2))
    with pytest.raises(ConfigError, match=r"^training\.agent_reward\.rules must be training's rule set 'paper', "
                                          r"got 'released'"):
        TrainConfig(agent_reward=AgentRewardConfig(rules="released"))
    with pytest.raises(ConfigError, match=r"^training\.rules must be the profile's rule set 'released', got 'paper'"):
        ProfileConfig(rules="released", training=TrainConfig())
    with pytest.raises(ConfigError, match=r"^rollout\.rules must be the profile's rule set 'paper', got 'released'"):
        ProfileConfig(rollout=RolloutConfig(rules="released"))
    custom = RuleSet("custom", f1_arithmetic="precision_recall")
    assert TrainConfig(rules=custom).grouping.rules is custom
    with pytest.raises(ConfigError, match=r"^training\.ranker_reward\.rules must be training's rule set RuleSet\(name='custom'"):
        TrainConfig(rules=custom, ranker_reward=RankerRewardConfig())
    with pytest.raises(ConfigError, match=r"^training\.rules: set in the profile's top-level 'rules:' section"):
        from_dict(ProfileConfig, {"training": {"rules": "released"}})
    with pytest.raises(ConfigError, match=r"^protocol\.search must be the profile's search budget "
                                          r"SearchBudget\(topn=50, topk=3, max_searches=6\) .*, got SearchBudget\(topn=50, topk=5"):
        ProfileConfig(search=SearchBudget(topk=3), protocol=ProtocolConfig())
    cfg = ProfileConfig(protocol=ProtocolConfig(worked_example=False))  # an equal budget: the profile's object replaces it
    assert cfg.protocol.search is cfg.search and cfg.rollout.search is cfg.search and not cfg.protocol.worked_example


def test_resolved_settings_are_computed_once_and_follow_a_later_assignment():
    g = GroupingConfig(rules="released")
    assert (g.min_size, g.dedupe) == (4, True)
    g.k_min, g.dedupe_identical = 2, False
    assert (g.min_size, g.dedupe) == (2, False)
    r = RankerRewardConfig()
    assert (r.form, r.format_fail_policy, r.invalid_penalized) == ("paper", "filter", False)
    r.variant = "released"
    assert (r.form, r.format_fail_policy, r.invalid_penalized) == ("released", "penalize", True)
    a = AgentRewardConfig()
    assert a.uses_yes_no_rule
    a.rules = RULE_SETS["released"]
    assert not a.uses_yes_no_rule


def test_training_families_keep_those_questions_by_name_or_hop_group_and_refuse_an_empty_filter():
    """``training.families`` (issue 48's multi-hop mix): data-source names or the paper's hop groups;
    empty keeps all; a filter that keeps nothing is refused, naming the families there are."""
    from cosearch_lib.data.qa_formats import QAExample
    from cosearch_lib.experiment.method_runs import training_questions

    qs = [QAExample(id=f"q{i}", question="?", golden_answers=["a"], data_source=src)
          for i, src in enumerate(["syn_nq", "syn_hotpotqa", "syn_2wiki", "syn_popqa", "musique"])]
    assert TrainConfig(families="multi").families == ("multi",)
    assert [q.id for q in training_questions(qs, TrainConfig(families="multi").families)] == ["q1", "q2", "q4"]
    assert [q.id for q in training_questions(qs, ("single",))] == ["q0", "q3"]
    assert [q.id for q in training_questions(qs, ("syn_popqa", "syn_2wiki"))] == ["q2", "q3"]
    assert training_questions(qs, ()) == qs
    with pytest.raises(ValueError, match=r"keeps none of the 5 training questions; their families: \['musique', 'syn_2wiki'"):
        training_questions(qs, ("syn_triviaqa",))
