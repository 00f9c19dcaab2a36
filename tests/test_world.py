"""The embedded world: determinism, sizes, schema, gold chains, leakage, files and caching."""

from __future__ import annotations

import dataclasses
import json
import re
import string
import time

import numpy as np
import pandas as pd
import pytest

import cosearch_lib.world.io as world_io
from cosearch_lib.config import WorldConfig
from cosearch_lib.metrics import has_answer
from cosearch_lib.world.built_world import World
from cosearch_lib.world.entities import ASKABLE, Entity, answers
from cosearch_lib.world.families import FAMILIES, SPLITS, world_fingerprint
from cosearch_lib.world.generate import generate_world
from cosearch_lib.world.io import build_world, world_summary, write_world
from cosearch_lib.world.questions import train_counts
from cosearch_lib.world.text import INDIRECT_TEMPLATES

_COMPARISON = re.compile(r", .+ or .+\?$")


@pytest.fixture(scope="module")
def tiny() -> World:
    return generate_world(WorldConfig.tiny())


@pytest.fixture(scope="module")
def default_world() -> tuple[World, float]:
    t0 = time.perf_counter()
    world = generate_world(WorldConfig())
    return world, time.perf_counter() - t0


def _all_rows(world: World) -> list[dict]:
    return [r for s in SPLITS for r in world.questions[s]]


def _norm(text: str) -> str:
    """SQuAD-style: lower-case, punctuation removed ("849,300" -> "849300"), whitespace collapsed."""
    return " ".join(text.lower().translate(str.maketrans("", "", string.punctuation)).split())


def _contents(world: World, pid: str) -> str:
    row = world.passages[int(pid)]
    assert row["id"] == pid
    return row["contents"]


# ----------------------------------------------------------------------------- determinism and size
def test_same_seed_same_world_and_different_seed_differs(tiny):
    again = generate_world(WorldConfig.tiny())
    assert json.dumps(again.passages) == json.dumps(tiny.passages)
    assert json.dumps(again.questions) == json.dumps(tiny.questions)
    other = generate_world(WorldConfig.tiny(seed=1))
    assert other.passages != tiny.passages
    assert [q["question"] for q in other.questions["test"]] != [q["question"] for q in tiny.questions["test"]]


def test_tiny_world_is_fast_and_small():
    t0 = time.perf_counter()
    world = generate_world(WorldConfig.tiny())
    assert time.perf_counter() - t0 < 2.0
    assert 300 <= len(world.passages) <= 800


def test_default_config_meets_minimum_sizes(default_world):
    world, seconds = default_world
    assert seconds < 10.0, f"default world took {seconds:.1f} s"
    assert 3000 <= len(world.passages) <= 7000  # the CPU encoder re-encodes it whenever the world changes
    assert len(world.questions["train"]) == 2000
    for split, per_family in (("test", 100), ("dev", 50)):
        counts = pd.Series([r["data_source"] for r in world.questions[split]]).value_counts()
        assert counts.to_dict() == dict.fromkeys(FAMILIES, per_family)


def test_every_family_in_every_split_with_requested_counts(tiny):
    cfg = tiny.config
    expected = {"train": train_counts(cfg.n_train_questions, cfg.train_mix),
                "dev": dict.fromkeys(FAMILIES, cfg.n_dev_per_family),
                "test": dict.fromkeys(FAMILIES, cfg.n_test_per_family)}
    for split in SPLITS:
        got = pd.Series([r["data_source"] for r in tiny.questions[split]]).value_counts().to_dict()
        assert got == expected[split]
        assert all(n > 0 for n in got.values())
    train = expected["train"]
    assert sum(train.values()) == cfg.n_train_questions
    assert train["syn_nq"] > train["syn_popqa"] and train["syn_hotpotqa"] > train["syn_bamboogle"]


def test_families_table():
    assert list(FAMILIES) == ["syn_nq", "syn_triviaqa", "syn_popqa", "syn_hotpotqa", "syn_2wiki", "syn_musique",
                              "syn_bamboogle"]
    assert {f.group for f in FAMILIES.values()} == {"single", "multi"}
    assert [f.mirrors for f in FAMILIES.values()] == ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                                      "musique", "bamboogle"]


def test_config_validation_names_the_bad_field():
    with pytest.raises(ValueError, match="distractor_rate"):
        WorldConfig(distractor_rate=1.5)
    with pytest.raises(ValueError, match="mention_pages"):
        WorldConfig(mention_pages=9)
    with pytest.raises(ValueError, match="namesake_rate"):
        WorldConfig(namesake_rate=-0.1)
    with pytest.raises(ValueError, match="train_mix"):
        WorldConfig(train_mix={"syn_nq": 1.0})
    assert WorldConfig(split_fractions=[0.5, 0.2, 0.3]).split_fractions == (0.5, 0.2, 0.3)  # YAML lists


# ----------------------------------------------------------------------------- schema and format
def _shape(obj):
    """Keys and types of a nested row, with list items' shapes merged (they must agree)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        shapes = {json.dumps(_shape(x), sort_keys=True) for x in obj}
        assert len(shapes) == 1, f"mixed list items: {shapes}"
        return [json.loads(shapes.pop())]
    return type(obj).__name__


def test_row_schema_keys_and_types(tiny):
    rows = _all_rows(tiny)
    shapes = {json.dumps(_shape(r), sort_keys=True) for r in rows}
    assert len(shapes) == 1  # one nested structure for every row: parquet-friendly
    r = rows[0]
    assert set(r) == {"id", "question", "golden_answers", "data_source", "prompt", "ability", "reward_model",
                      "extra_info"}
    assert set(r["extra_info"]) == {"split", "index", "question", "family", "hops", "gold_chain"}
    assert set(r["extra_info"]["gold_chain"][0]) == {"sub_query", "answer", "passage_ids"}
    for split in SPLITS:
        for i, r in enumerate(tiny.questions[split]):
            assert r["prompt"] == [{"role": "user", "content": r["question"]}]
            assert r["ability"] == "fact-reasoning"
            assert r["reward_model"] == {"style": "rule", "ground_truth": {"target": r["golden_answers"]}}
            ex = r["extra_info"]
            assert (ex["split"], ex["index"], ex["question"], ex["family"]) == (split, i, r["question"], r["data_source"])
            assert ex["hops"] == len(ex["gold_chain"]) >= 1
            assert r["golden_answers"] and all(isinstance(a, str) and a for a in r["golden_answers"])


def test_wiki18_contents_format_and_ids(tiny):
    assert [p["id"] for p in tiny.passages] == [str(i) for i in range(len(tiny.passages))]
    cfg = tiny.config
    for p in tiny.passages:
        assert set(p) == {"id", "contents"}
        m = re.fullmatch(r'"([^"\n]+)"\n(\S[^\n]*)', p["contents"])
        assert m, p["contents"]
        assert cfg.min_passage_words <= len(m.group(2).split()) <= cfg.max_passage_words


def test_entity_passages_name_their_entity(tiny):
    for p, m in zip(tiny.passages, tiny.passage_meta):
        if m["kind"] != "distractor":
            assert tiny.entities[m["entity"]].name in p["contents"].split("\n", 1)[1]


def test_unique_ids_and_question_texts(default_world):
    world, _ = default_world
    rows = _all_rows(world)
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["question"] for r in rows}) == len(rows)
    assert len({p["id"] for p in world.passages}) == len(world.passages)
    titles = [e.title.lower() for e in world.entities.values()]
    assert len(set(titles)) == len(titles)  # namesakes share a name, never a title


# ----------------------------------------------------------------------------- gold chains
def test_single_hop_golden_answers_appear_in_gold_passages(default_world):
    world, _ = default_world
    for r in _all_rows(world):
        if FAMILIES[r["data_source"]].group != "single":
            continue
        (hop,) = r["extra_info"]["gold_chain"]
        texts = [_norm(_contents(world, pid)) for pid in hop["passage_ids"]]
        primary = _norm(r["golden_answers"][0])
        assert any(primary in t for t in texts), r
        for alias in map(_norm, r["golden_answers"]):
            # An alias is printed itself, or is a longer / shorter form of the printed answer
            # ("Republic of X" / "X", "director" / "film director").
            assert any(alias in t for t in texts) or primary in alias or alias in primary, (alias, r)


def test_every_hop_passage_contains_the_hop_answer(default_world):
    world, _ = default_world
    for r in _all_rows(world):
        for hop in r["extra_info"]["gold_chain"]:
            assert hop["passage_ids"], r
            for pid in hop["passage_ids"]:
                assert hop["answer"].lower() in _contents(world, pid).lower(), (hop, pid)
                assert world.passage_meta[int(pid)]["kind"] != "distractor"


def test_chains_are_connected_and_end_at_the_answer(default_world):
    world, _ = default_world
    for r in _all_rows(world):
        chain = r["extra_info"]["gold_chain"]
        if r["data_source"] in ("syn_musique", "syn_bamboogle"):
            assert len(chain) == (3 if r["data_source"] == "syn_musique" else 2)
            for prev, nxt in zip(chain, chain[1:]):
                assert prev["answer"] in nxt["sub_query"], chain  # each hop searches for the previous answer
        if r["golden_answers"][0] not in ("yes", "no") and not _COMPARISON.search(r["question"]):
            assert chain[-1]["answer"] == r["golden_answers"][0]
            assert _norm(r["golden_answers"][0]) not in _norm(r["question"]), r  # the question does not give it away


def test_comparisons_and_yes_no_are_consistent_and_balanced(default_world):
    world, _ = default_world
    for split in SPLITS:
        answers = [r["golden_answers"][0] for r in world.questions[split] if r["data_source"] == "syn_2wiki"]
        yes, no = answers.count("yes"), answers.count("no")
        assert yes > 0 and abs(yes - no) <= 1, (split, yes, no)
        first = second = 0
        for r in world.questions[split]:
            chain = r["extra_info"]["gold_chain"]
            if r["golden_answers"][0] in ("yes", "no"):
                assert (chain[0]["answer"] == chain[1]["answer"]) == (r["golden_answers"][0] == "yes")
            elif _COMPARISON.search(r["question"]):
                a, b = re.search(r", (.+) or (.+)\?$", r["question"]).groups()
                assert r["golden_answers"][0] in (a.strip("'"), b.strip("'"))
                first += r["golden_answers"][0] == a.strip("'")
                second += r["golden_answers"][0] == b.strip("'")
        assert abs(first - second) <= 2, (split, first, second)


# ----------------------------------------------------------------------------- leakage
def test_no_leakage_across_splits(default_world):
    world, _ = default_world
    facts = {s: set() for s in SPLITS}
    anchors = {s: set() for s in SPLITS}
    subjects = {s: set() for s in SPLITS}
    for s in SPLITS:
        for r in world.questions[s]:
            meta = world.question_meta[r["id"]]
            facts[s] |= {tuple(f) for f in meta["facts"]}
            anchors[s] |= set(meta["anchors"])
            subjects[s] |= {f[0] for f in meta["facts"]}
    for held_out in ("dev", "test"):
        assert not facts[held_out] & facts["train"]
        assert not subjects[held_out] & anchors["train"]
    assert not facts["dev"] & facts["test"]
    texts = {s: {r["question"] for r in world.questions[s]} for s in SPLITS}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]


# ----------------------------------------------------------------------------- distractors
def test_near_duplicates_distractors_and_near_names_exist(default_world):
    world, _ = default_world
    kinds = pd.Series([m["kind"] for m in world.passage_meta]).value_counts()
    assert kinds["paraphrase"] > 50 and kinds["ablated"] > 50 and kinds["distractor"] > 100 and kinds["mention"] > 500
    main = {(m["entity"], m["section"]): (p, m) for p, m in zip(world.passages, world.passage_meta) if m["kind"] == "main"}
    for p, m in zip(world.passages, world.passage_meta):
        if m["kind"] in ("paraphrase", "ablated"):
            orig_p, orig_m = main[(m["entity"], m["section"])]
            assert p["contents"] != orig_p["contents"]
            same, fewer = {tuple(f) for f in m["facts"]}, {tuple(f) for f in orig_m["facts"]}
            assert same == fewer if m["kind"] == "paraphrase" else same < fewer
        if m["kind"] == "distractor":
            assert m["facts"] == [] and m["mentions"] == []
            assert any(world.entities[e].name in p["contents"] for e in m["entity"].split(","))
    assert world.near_names
    for a, b in world.near_names:
        ea, eb = world.entities[a], world.entities[b]
        assert ea.type == eb.type and ea.name != eb.name
        if ea.type == "person":
            assert ea.info["given"] == eb.info["given"]
    assert {world.entities[a].type for a, _ in world.near_names} == {"person", "city", "org", "work"}


# ----------------------------------------------------------------------------- files
def _py(value):
    """pandas/pyarrow values back to plain Python (arrays -> lists, numpy scalars -> Python)."""
    if isinstance(value, dict):
        return {k: _py(v) for k, v in value.items()}
    if isinstance(value, (list, np.ndarray)):
        return [_py(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def test_write_world_round_trips_and_leaves_no_temp_files(tiny, tmp_path):
    paths = write_world(tiny, tmp_path / "w")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == sorted(p.name for p in paths.values())
    for split in SPLITS:
        df = pd.read_parquet(paths[split])
        assert [_py(r) for r in df.to_dict("records")] == tiny.questions[split]
    lines = paths["corpus"].read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == tiny.passages
    manifest = json.loads(paths["world"].read_text())
    assert manifest["fingerprint"] == world_fingerprint(tiny.config)
    assert manifest["counts"]["questions"]["test"] == dict(sorted(dict.fromkeys(FAMILIES, 10).items()))


def test_same_config_gives_byte_identical_files(tiny, tmp_path):
    a = write_world(tiny, tmp_path / "a")
    b = write_world(generate_world(WorldConfig.tiny()), tmp_path / "b")
    for key in a:
        assert a[key].read_bytes() == b[key].read_bytes(), key


def test_crashed_write_keeps_the_old_world(tiny, tmp_path, monkeypatch):
    out = tmp_path / "w"
    write_world(tiny, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(OSError, match="disk full"):
        write_world(generate_world(WorldConfig.tiny(seed=3)), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp folder, nothing half-replaced


def test_build_world_reuses_a_matching_world(tmp_path, monkeypatch):
    cfg, out = WorldConfig.tiny(), tmp_path / "w"
    paths = build_world(cfg, out)
    stamp = paths["corpus"].stat().st_mtime_ns

    def must_not_generate(cfg):
        raise AssertionError("regenerated a cached world")

    with monkeypatch.context() as m:
        m.setattr(world_io, "generate_world", must_not_generate)
        assert build_world(cfg, out) == paths
    assert paths["corpus"].stat().st_mtime_ns == stamp
    build_world(WorldConfig.tiny(seed=5), out)  # a different config replaces it
    assert json.loads(paths["world"].read_text())["config"]["seed"] == 5
    paths["train"].write_bytes(b"truncated")  # a damaged file is detected and rebuilt
    build_world(WorldConfig.tiny(seed=5), out)
    assert len(pd.read_parquet(paths["train"])) == cfg.n_train_questions


def test_world_summary_counts(tiny):
    df = world_summary(tiny)
    q = df[df.section == "questions"]
    assert len(q) == len(SPLITS) * len(FAMILIES)
    assert q["count"].sum() == sum(len(v) for v in tiny.questions.values())
    p = df[df.section == "passages"]
    assert p["count"].sum() == len(tiny.passages)
    assert (p["mean_words"] >= tiny.config.min_passage_words).all()


# ----------------------------------------------------------------------------- hard negatives
def _answers_of(world: World, e: Entity) -> list[list[str]]:
    return [answers(world.entities, r, e.attrs[r]) for r in ASKABLE[e.type] if e.attrs.get(r) is not None]


def test_mention_passages_name_their_target_and_hold_none_of_its_answers(default_world):
    world, _ = default_world
    seen = 0
    for p, m in zip(world.passages, world.passage_meta):
        if m["kind"] != "mention":
            continue
        seen += 1
        target = world.entities[m["entity"]]
        assert m["mentions"] and all(t == target.id for t, _ in m["mentions"])
        assert p["contents"].count(target.name) >= 1 + len(m["mentions"])  # the title, and each sentence
        for gold in _answers_of(world, target):  # a negative for *every* question about the target
            assert not has_answer(p["contents"], gold), (gold, p["contents"])
        # Each sentence states another entity's value of the mentioned relation, truthfully.
        stated = {(f[0], f[1]) for f in m["facts"]}
        assert {r for _, r in m["mentions"]} <= {r for _, r in stated}
        for subject, rel in stated:
            e = world.entities[subject]
            assert subject != target.id
            assert has_answer(p["contents"], answers(world.entities, rel, e.attrs[rel])[:1]), (subject, rel)
    assert seen > 500


def test_most_facts_have_a_hard_negative(default_world):
    world, _ = default_world
    covered = {tuple(x) for m in world.passage_meta for x in m["mentions"]}
    facts = [(e.id, r) for e in world.entities.values() for r in ASKABLE[e.type] if e.attrs.get(r) is not None]
    share = sum(f in covered for f in facts) / len(facts)
    assert 0.3 < share <= 1.0, share


def test_namesakes_are_disambiguated_everywhere(default_world):
    world, _ = default_world
    assert len(world.namesakes) >= 20
    by_name: dict[str, list[Entity]] = {}
    for e in world.entities.values():
        by_name.setdefault(e.name, []).append(e)
    for a, b in world.namesakes:
        ea, eb = world.entities[a], world.entities[b]
        assert ea.name == eb.name and len(by_name[ea.name]) == 2
        assert ea.attrs["occupation"] == ea.info["disambig"] != eb.info["disambig"] == eb.attrs["occupation"]
        assert ea.title == f"{ea.name} ({ea.info['disambig']})" != eb.title
    twins = {world.entities[x].name: (world.entities[x], world.entities[y]) for x, y in world.namesakes}
    asked = 0
    for r in _all_rows(world):
        named = [n for n in twins if re.search(rf"\b{n}\b", r["question"], re.I)]
        for name in named:  # a question that names a namesake says which one
            asked += 1
            assert any(f"{e.info['disambig']} {name}".lower() in r["question"].lower() for e in twins[name]), r["question"]
        for hop in r["extra_info"]["gold_chain"]:
            for name in twins:
                if re.search(rf"\b{name}\b", hop["sub_query"]) and not hop["sub_query"].startswith("what was the occupation"):
                    assert any(f"the {e.info['disambig']} {name}" in hop["sub_query"] for e in twins[name]), hop
    assert asked > 10


def test_no_question_asks_a_namesake_its_disambiguator(default_world):
    world, _ = default_world
    for r in _all_rows(world):
        if r["data_source"] in ("syn_nq", "syn_popqa"):
            assert _norm(r["golden_answers"][0]) not in _norm(r["question"]), r["question"]


def test_indirect_phrasing_is_a_knob(tiny):
    phrases = ["carried the passport of", "spent much of", "is credited", "opened its doors", "owes its existence",
               "lies within the borders", "dates back to", "Public life in", "home town", "grew up in"]
    assert all(any(p in t for ts in INDIRECT_TEMPLATES.values() for t in ts) for p in phrases)

    def share(world):
        main = [p["contents"] for p, m in zip(world.passages, world.passage_meta) if m["kind"] == "main"]
        return sum(any(x in c for x in phrases) for c in main) / len(main)

    direct = generate_world(dataclasses.replace(WorldConfig.tiny(), indirect_rate=0.0))
    assert share(direct) == 0.0 < share(tiny)
