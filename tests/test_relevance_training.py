"""The ranker's relevance training (the paper's Fixed Ranker): rewards and groups per prompt, an
update that moves the ranker adapter only, the answerable-pool filter, validation rows, and a resume
that ends on the uninterrupted run's records and weights.

Rankings come from a scripted backend (an untrained model would break the protocol on every call,
so every reward would tie); the updates run on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cosearch_lib import experiment
from cosearch_lib.config import (
    ConfigError,
    GRPOConfig,
    ProtocolConfig,
    RelevanceConfig,
    RolloutConfig,
    SearchBudget,
    TrainConfig,
    load_profile,
)
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.experiment import cached_starts
from cosearch_lib.models.adapter_weights import adapter_change
from cosearch_lib.models.lora_policies import PolicySet, adapter_parameters, lora_model
from cosearch_lib.records.ranker_quality import read_relevance_run, relevance_endpoints
from cosearch_lib.rl.ranker_validation import gold_sub_queries
from cosearch_lib.rl.relevance_training import RELEVANCE_METHOD, RelevanceInputs, RelevanceTrainer, ranking_items
from cosearch_lib.run_schema import RELEVANCE_STEP_GLOSSARY, VALIDATION_COLUMNS, describe_step_metric, latest_checkpoint

from tests.doubles import CORPUS, LORA, FixedRetriever, ScriptedBackend, tiny_model


def chain(*hops: tuple[str, str]) -> dict:
    return {"extra_info": {"gold_chain": [{"sub_query": q, "answer": a, "passage_ids": []} for q, a in hops]}}


# FixedRetriever returns the corpus in order whatever the query: [1] Drask, [2] Tellis/Kessmere,
# [3] Tellis/atlases, [4] bells, [5] mill/1843, [6] harbour.
TRAIN = [
    QAExample(id="t1", question="Where was the atlas writer born?", golden_answers=["Kessmere"], data_source="syn_hotpotqa",
              extra=chain(("Who wrote the atlases?", "atlases"), ("Where was Tellis born?", "Kessmere"))),
    QAExample(id="t2", question="When was the mill built?", golden_answers=["1843"], data_source="syn_nq",
              extra=chain(("When was the mill built?", "1843"))),
    QAExample(id="t3", question="Who painted the lost fresco?", golden_answers=["Ilse Marr"], data_source="syn_nq",
              extra=chain(("Who painted the lost fresco?", "Ilse Marr"))),  # in no candidate: left out of the pool
]
VAL = [QAExample(id="v1", question="Which town is on the river?", golden_answers=["Drask"], data_source="syn_popqa",
                 extra=chain(("Which town is on the river?", "Drask")))]
RELEVANT_OF = {"Who wrote the atlases?": 3, "Where was Tellis born?": 2, "When was the mill built?": 5,
               "Which town is on the river?": 1}


def ranking_script(prompt, key):
    """Even samples put the sub-query's answer passage first, odd ones a passage without it; sample 3
    breaks the protocol. Greedy validation rankings find the answer passage."""
    _, kind, *rest = key
    if kind == "validation":
        return "<reason>r</reason><rerank>[1] > [4]</rerank>"
    sample = rest[3]  # rest: step, position in the step, item, sample
    if sample == 3:
        return "I think [2] is best."
    return "<reason>r</reason><rerank>" + ("[{}] > [6]" if sample % 2 == 0 else "[4] > [6]") + "</rerank>"


def scripted(tok, sub_queries, backend_class=ScriptedBackend):
    """The ranking script with each training row's relevant passage filled in (row keys name the item)."""
    relevant = {s.item_id: RELEVANT_OF.get(s.sub_query, 1) for s in sub_queries}

    def respond(prompt, key):
        text = ranking_script(prompt, key)
        return text.format(relevant[key[4]]) if key[1] == "relevance" else text

    return backend_class(tok, respond)


class DiskAdapterBackend(ScriptedBackend):
    """A scripted backend that, like vLLM, samples with adapters registered from disk."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.registered: list[str] = []

    def add_adapter(self, name, path):
        self.registered.append(name)


def relevance_trainer(tok, out_dir, *, steps=2, backend_class=ScriptedBackend, training=None, seed=0, val=VAL, **kw):
    cfg = RelevanceConfig(enabled=True, steps=steps, prompts_per_step=2, group_size=4, lr=1e-2, eval_every=1,
                          checkpoint_every=1, micro_batch=2, **kw)
    model = lora_model(tiny_model(tok), {"ranker": None}, LORA)
    policies = PolicySet(model, {"ranker": "ranker"}, ["ranker"], {"ranker": cfg.lr})
    prompts = gold_sub_queries(TRAIN)
    search = SearchBudget(topn=6, topk=2)
    inputs = RelevanceInputs(policies, tok, FixedRetriever(CORPUS), prompts, gold_sub_queries(val),
                             RolloutConfig(search=search, ranker_max_new_tokens=32), ProtocolConfig(search=search),
                             backend=scripted(tok, prompts, backend_class), training=training or TrainConfig())
    return RelevanceTrainer(cfg, inputs, out_dir=out_dir, seed=seed, progress=False)


def weights(t):
    return {n: p.detach().clone() for n, p in adapter_parameters(t.policies.model, "ranker").items()}


def test_the_pool_keeps_sub_queries_with_a_relevant_candidate(tok, tmp_path):
    items = ranking_items(gold_sub_queries(TRAIN), FixedRetriever(CORPUS), 6)
    assert [(it.query.item_id, it.relevant) for it in items] == [
        ("t1/hop0", (0, 0, 1, 0, 0, 0)), ("t1/hop1", (0, 1, 0, 0, 0, 0)), ("t2/hop0", (0, 0, 0, 0, 1, 0)),
        ("t3/hop0", (0, 0, 0, 0, 0, 0))]
    t = relevance_trainer(tok, tmp_path)
    assert t.pool_stats == {"sub_queries": 4, "answerable": 3}
    assert "t3/hop0" not in {it.query.item_id for it in t.pool}


def test_a_step_scores_each_sample_groups_by_prompt_and_moves_only_the_ranker(tok, tmp_path):
    t = relevance_trainer(tok, tmp_path)
    base = {n: p.detach().clone() for n, p in t.policies.model.named_parameters() if "lora_" not in n}
    before = weights(t)
    rec = t.train_step()
    # per prompt: samples 0, 2 show the answer first (r_rel 1), sample 1 shows none (0), sample 3 is invalid (-0.2)
    assert rec["ranker/n_prompts"] == 2 and rec["ranker/n_samples"] == 8
    assert rec["ranker/reward"] == pytest.approx((1 + 0 + 1 - 0.2) / 4)
    assert rec["ranker/hit@1"] == pytest.approx(0.5) and rec["ranker/valid_rate"] == pytest.approx(0.75)
    assert rec["ranker/groups_with_signal"] == 2 and rec["loss/ranker_n_forwarded"] == 8
    now = dict(t.policies.model.named_parameters())
    assert any(not torch.equal(v, now[n]) for n, v in before.items())
    assert all(torch.equal(v, now[n]) for n, v in base.items())
    for key in rec:  # every column is documented
        assert describe_step_metric(key, RELEVANCE_STEP_GLOSSARY)


def test_the_relevance_update_runs_with_the_profiles_training_knobs_and_its_own_loss(tok, tmp_path, monkeypatch):
    """One set of update settings for both trainers: the relevance update takes its loss and
    micro-batch from ``relevance`` and clipping, length grouping, shared prefix and gradient
    checkpointing from ``training`` (it used to run with grpo_update's defaults whatever the profile)."""
    from cosearch_lib.rl import relevance_training

    seen = []
    real = relevance_training.grpo_update
    monkeypatch.setattr(relevance_training, "grpo_update",
                        lambda policies, adapter, jobs, settings, **kw: seen.append(settings) or real(policies, adapter, jobs,
                                                                                                      settings, **kw))
    training = TrainConfig(max_grad_norm=0.5, length_grouped_micro_batches=False, gradient_checkpointing=True,
                           shared_prefix_update=False, minibatches=3, micro_batch=7)
    t = relevance_trainer(tok, tmp_path, steps=1, training=training, val=())
    t.run()
    (settings,) = seen
    assert (settings.max_grad_norm, settings.length_grouped, settings.gradient_checkpointing, settings.shared_prefix) == \
        (0.5, False, True, False)
    assert (settings.micro_batch, settings.minibatches, settings.grpo) == (2, 1, t.cfg.grpo)
    # no held-out sub-queries, so no validation rows: the quality table says why, not a KeyError
    _, validation = read_relevance_run(tmp_path)
    assert list(validation.columns) == list(VALIDATION_COLUMNS)
    with pytest.raises(ValueError, match="no ranker validation rows"):
        relevance_endpoints(validation)


def test_an_unpenalised_invalid_output_scores_its_retriever_fallback(tok, tmp_path):
    t = relevance_trainer(tok, tmp_path, invalid_penalty=None)
    items = [it.query.item_id for it in t.step_items(0)]
    rec = t.train_step()
    # sample 3 falls back to the retriever's top-2, [1] and [2]: mean Hit@{1,3,5} is 2/3 for t1/hop1 (answer
    # in [2]), 0 for the others (answers in [3] and [5])
    fallback = {"t1/hop0": 0.0, "t1/hop1": 2 / 3, "t2/hop0": 0.0}
    assert rec["ranker/reward"] == pytest.approx(sum(2 + fallback[i] for i in items) / 8)


def test_validation_rows_before_the_first_update_and_after_each_due_step(tok, tmp_path):
    t = relevance_trainer(tok, tmp_path, steps=2)
    frame = t.run()
    assert list(frame["step"]) == [-1, 0, 1]
    assert frame["val/ranker_hit@1"].tolist() == [1.0, 1.0, 1.0]  # the scripted greedy ranking finds Drask
    val = t.validation_frame()
    assert list(val.columns) == list(VALIDATION_COLUMNS)
    assert set(val["method"]) == {RELEVANCE_METHOD} and sorted(val["step"].unique()) == [-1, 0, 1]
    assert (tmp_path / "steps.csv").exists() and (tmp_path / "validation.csv").exists()


def test_a_kl_term_toward_the_start_trains_the_relevance_ranker_against_its_frozen_copy(tok, tmp_path):
    t = relevance_trainer(tok, tmp_path, steps=1, grpo=GRPOConfig(kl_coef=0.1, kl_reference="start"))
    copy = t.policies.reference_adapter("ranker")
    start = {n.replace(".ranker.", f".{copy}."): v for n, v in weights(t).items()}
    rec = t.train_step()
    frozen = {n: p.detach() for n, p in adapter_parameters(t.policies.model, copy).items()}
    assert rec["loss/ranker_kl"] == 0.0  # one optimizer step: the policy was its reference in the forward pass
    assert any(not torch.equal(v, weights(t)[n.replace(f".{copy}.", ".ranker.")]) for n, v in start.items())
    assert frozen.keys() == start.keys() and all(torch.equal(start[n], frozen[n]) for n in start)


def test_resume_ends_on_the_uninterrupted_run(tok, tmp_path):
    full = relevance_trainer(tok, tmp_path / "full", steps=3)
    start = weights(full)
    full.run()
    assert any(not torch.equal(v, weights(full)[n]) for n, v in start.items())  # it moved: the resume test means something
    killed = relevance_trainer(tok, tmp_path / "killed", steps=3)
    killed.run(steps=2)
    resumed = relevance_trainer(tok, tmp_path / "killed", steps=3)
    with torch.no_grad():
        for p in resumed.policies.model.parameters():
            if p.requires_grad:
                p.normal_()
    assert resumed.load_checkpoint() == 2 and latest_checkpoint(tmp_path / "killed").name == "step_000002"
    resumed.run()

    def comparable(records):
        return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]

    assert comparable(resumed.records) == comparable(full.records)
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)
    saved = resumed.save_ranker(tmp_path / "out")
    assert saved == tmp_path / "out" / "ranker" and (saved / "adapter_config.json").exists()
    moved = adapter_change(tmp_path / "killed" / "checkpoints" / "step_000003" / "adapters" / "ranker", saved)
    assert moved["changed"] == 0 and moved["lora_B_max_abs"] > 0
    with pytest.raises(ValueError, match="trained with seed 0, not 1"):  # the joint trainer's checks, one copy
        relevance_trainer(tok, tmp_path / "killed", steps=3, seed=1).load_checkpoint()


def test_relevance_settings_are_checked_and_key_the_cache():
    with pytest.raises(ConfigError, match="relevance.group_size"):
        RelevanceConfig(group_size=1)
    with pytest.raises(ConfigError, match="relevance.relevance"):
        RelevanceConfig(relevance="judge")
    with pytest.raises(ConfigError, match="relevance.cosearch_start"):
        RelevanceConfig(cosearch_start="base")
    with pytest.raises(ConfigError, match="relevance.hit_ks"):
        RelevanceConfig(hit_ks=(0, 1))
    cfg = load_profile("ci")
    from dataclasses import replace

    other = replace(cfg, relevance=replace(cfg.relevance, steps=cfg.relevance.steps + 1))
    assert experiment.relevance_dir(other) != experiment.relevance_dir(cfg)
    assert experiment.relevance_dir(cfg).parent.name == "relevance"


def test_the_engine_keys_the_relevance_training_but_not_the_warm_start():
    """The warm start never generates (gold data, teacher-forced SFT): ci_vllm reuses ci's. The
    generative ranker's relevance GRPO samples on the engine: its own folder. A profile on the default
    engine keeps the key of the plain fingerprint, so no cached warm start is orphaned."""
    ci, on_vllm = load_profile("ci"), load_profile("ci_vllm")
    assert on_vllm.models.backend == "vllm" and ci.models.backend == "transformers"
    assert experiment.warmstart_dir(on_vllm) == experiment.warmstart_dir(ci)
    assert experiment.relevance_dir(on_vllm) != experiment.relevance_dir(ci)
    sections = ("world", "data", "retrieval", "search", "protocol", "models", "warmstart", "lora", "seed")
    assert experiment.warmstart_dir(ci).name.endswith(ci.fingerprint(*sections))
    assert on_vllm.fingerprint(*sections) != ci.fingerprint(*sections)  # the plain fingerprint does see the engine


@pytest.mark.parametrize(("method", "cosearch_start", "ranker"), [
    ("fixed_ranker", "warmstart", "relevance"), ("cosearch", "warmstart", "warm"), ("cosearch", "relevance", "relevance")])
def test_each_method_starts_its_ranker_where_the_settings_say(monkeypatch, tmp_path, method, cosearch_start, ranker):
    from dataclasses import replace

    cfg = load_profile("ci")
    cfg = replace(cfg, relevance=replace(cfg.relevance, enabled=True, cosearch_start=cosearch_start))
    monkeypatch.setattr(cached_starts, "policy_starts", lambda *a, **k: {"agent": tmp_path / "a", "ranker": tmp_path / "warm"})
    monkeypatch.setattr(cached_starts, "relevance_ranker", lambda *a, **k: tmp_path / "relevance")
    starts = experiment.method_starts(cfg, None, method)
    assert starts == {"agent": tmp_path / "a", "ranker": tmp_path / ranker}
    off = replace(cfg, relevance=replace(cfg.relevance, enabled=False))
    assert experiment.method_starts(off, None, method)["ranker"] == tmp_path / "warm"


@pytest.mark.parametrize("kind", ["llm", "llm_judge"])
def test_a_method_without_a_ranker_builds_no_ranker_start(monkeypatch, tmp_path, kind):
    """Retrieval Only and the Oracle read no ranker: their training must not train the ranker's warm start
    or the LLM judge (on a fresh machine the judge alone takes ~15 min on 2 cores)."""
    from dataclasses import replace

    from cosearch_lib.run_schema import SCORER_SLOT

    cfg = load_profile("ci")
    cfg = replace(cfg, training=replace(cfg.training, ranker_kind=kind))
    asked, judged = [], []
    monkeypatch.setattr(cached_starts, "warm_start", lambda c, r, roles=None, progress=True:
                        asked.append(tuple(roles)) or {role: tmp_path / role for role in roles})
    monkeypatch.setattr(cached_starts, "fixed_ranker", lambda *a, **k: judged.append(1) or tmp_path / "judge")
    for method in ("search_r1", "oracle"):
        assert experiment.method_starts(cfg, None, method) == {"agent": tmp_path / "agent"}
    assert asked == [("agent",), ("agent",)] and judged == []
    starts = experiment.method_starts(cfg, None, "cosearch")
    if kind == "llm_judge":  # the judge is the ranker policy: no generative ranker adapter to warm-start
        assert asked[-1] == ("agent",) and starts == {"agent": tmp_path / "agent", SCORER_SLOT: tmp_path / "judge"}
    else:
        assert asked[-1] == ("agent", "ranker") and judged == [] and set(starts) == {"agent", "ranker"}


def test_a_backend_that_reads_adapters_from_disk_gets_the_ranker_before_it_generates_after_each_update_and_on_resume(
        tok, tmp_path):
    t = relevance_trainer(tok, tmp_path, steps=2, backend_class=DiskAdapterBackend)
    assert t.backend.registered == [] and not (tmp_path / "live_adapters").exists()  # the constructor writes nothing
    t.run()  # before the start's validation, then after each of the 2 updates
    assert t.backend.registered == ["ranker"] * 3
    assert (tmp_path / "live_adapters" / "ranker" / "adapter_config.json").exists()
    again = relevance_trainer(tok, tmp_path, steps=3, backend_class=DiskAdapterBackend)
    assert again.load_checkpoint() == 2 and again.backend.registered == []
    again.run()  # the restored weights before step 2's rollout, then the update
    assert again.backend.registered == ["ranker"] * 2


def test_a_stop_signal_ends_the_step_checkpoints_and_resumes_like_the_joint_trainer(tok, tmp_path):
    import os
    import signal

    from cosearch_lib.stop_signals import StopRequested

    t = relevance_trainer(tok, tmp_path / "run", steps=3)
    t.cfg = replace(t.cfg, checkpoint_every=0)  # only the stop writes one before the last step
    step = t.train_step

    def step_then_signal():
        record = step()
        if t.step == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # as SLURM warns of its time limit
        return record

    t.train_step = step_then_signal
    with pytest.raises(StopRequested, match="stopped on SIGUSR1 after step 1") as stopped:
        t.run()
    assert stopped.value.step == 1 and latest_checkpoint(tmp_path / "run").name == "step_000001"
    again = relevance_trainer(tok, tmp_path / "run", steps=3)
    assert again.load_checkpoint() == 1
    again.run()
    assert again.step == 3


@pytest.mark.parametrize("kind", ["llm", "llm_judge", "cross_encoder"])
def test_the_fixed_ranker_counts_as_cached_only_when_its_kinds_folder_is_whole(monkeypatch, tmp_path, kind):
    """`cosearch run` builds no retriever for a cached Fixed Ranker (``fixed_ranker_cached``); a
    folder without its marker file (a training killed before the end) is not cached."""
    from dataclasses import replace

    from cosearch_lib.models.cross_encoder import MARKER as CROSS_ENCODER_MARKER
    from cosearch_lib.models.llm_judge import JUDGE_MARKER

    monkeypatch.setenv("COSEARCH_CACHE", str(tmp_path))
    cfg = load_profile("ci")
    cfg = replace(cfg, training=replace(cfg.training, ranker_kind=kind), relevance=replace(cfg.relevance, enabled=True))
    folder, marker = {"llm": (experiment.relevance_dir(cfg) / "ranker", "adapter_config.json"),
                      "llm_judge": (experiment.llm_judge_dir(cfg), JUDGE_MARKER),
                      "cross_encoder": (experiment.cross_encoder_dir(cfg), CROSS_ENCODER_MARKER)}[kind]
    assert folder.is_relative_to(tmp_path)
    folder.mkdir(parents=True)
    assert not experiment.fixed_ranker_cached(cfg)
    (folder / marker).write_text("{}")
    assert experiment.fixed_ranker_cached(cfg)
    if kind == "llm":  # no relevance training: the warm-started ranker is the Fixed Ranker, nothing to train
        (folder / marker).unlink()
        assert experiment.fixed_ranker_cached(replace(cfg, relevance=replace(cfg.relevance, enabled=False)))


# ----------------------------------------------------------------------------- the prepared relevance set


def test_the_prepared_set_keeps_queries_with_an_answer_in_their_top_n_and_training_reads_it_without_searching(tok, tmp_path):
    """Break 6 of issue 47: the paper's Fixed Ranker trains on relevance data (training queries, top-N,
    answer containment, the unanswerable dropped). The set is written once; the trainer's pool is the
    file's queries, and no training query is searched again."""
    from cosearch_lib.retrieval.relevance_sets import prepare_relevance_set, read_relevance_set, select_queries, sidecar_path
    from cosearch_lib.rl.relevance_training import prepared_items

    path = tmp_path / "relevance" / "set.jsonl.gz"
    queries = select_queries(TRAIN, sources=["syn_nq", "syn_hotpotqa"])
    assert [q.id for q in select_queries(TRAIN, sources=["syn_nq"])] == ["t2", "t3"]
    summary = prepare_relevance_set(queries, FixedRetriever(CORPUS), 6, path, settings={"n": 3}, batch_size=2, progress=False)
    # t1's answer "Kessmere" is in candidate [2], t2's "1843" in [5]; t3's "Ilse Marr" in none: dropped
    assert (summary["queries"], summary["kept"], summary["dropped"]) == (3, 2, 1)
    assert summary["per_source"] == {"syn_hotpotqa": {"queries": 1, "kept": 1}, "syn_nq": {"queries": 2, "kept": 1}}
    assert sidecar_path(path).is_file()
    again = prepare_relevance_set(queries, FixedRetriever(CORPUS), 6, path, settings={"n": 3}, progress=False)
    assert again["sha256"] == summary["sha256"]  # the same set, the same bytes: the Fixed Ranker's cache key holds
    read = read_relevance_set(path, topn=6)
    assert [(q.id, q.relevant) for q in read] == [("t1", (0, 1, 0, 0, 0, 0)), ("t2", (0, 0, 0, 0, 1, 0))]
    assert read[0].candidates == tuple(FixedRetriever(CORPUS).search(["x"], 6)[0])

    items = prepared_items(read)
    cfg = RelevanceConfig(enabled=True, steps=1, prompts_per_step=2, group_size=4, lr=1e-2, eval_every=0, micro_batch=2)
    model = lora_model(tiny_model(tok), {"ranker": None}, LORA)
    policies = PolicySet(model, {"ranker": "ranker"}, ["ranker"], {"ranker": cfg.lr})
    search = SearchBudget(topn=6, topk=2)
    retriever = FixedRetriever(CORPUS)
    inputs = RelevanceInputs(policies, tok, retriever, [], gold_sub_queries(VAL),
                             RolloutConfig(search=search, ranker_max_new_tokens=32), ProtocolConfig(search=search),
                             backend=scripted(tok, [it.query for it in items]), items=items)
    t = RelevanceTrainer(cfg, inputs, out_dir=tmp_path / "run", seed=0, progress=False)
    assert t.pool_stats == {"sub_queries": 2, "answerable": 2} and [it.query.item_id for it in t.pool] == ["t1/question", "t2/question"]
    assert retriever.calls == []  # the pool came from the file: no training query was searched
    before = weights(t)
    t.train_step()
    assert any(not torch.equal(v, weights(t)[n]) for n, v in before.items())


def test_a_relevance_set_that_is_malformed_or_short_is_refused_naming_file_and_line(tmp_path):
    import gzip
    import json

    from cosearch_lib.data.qa_formats import DataFormatError
    from cosearch_lib.retrieval.relevance_sets import prepare_relevance_set, read_relevance_set

    path = tmp_path / "set.jsonl.gz"
    with pytest.raises(FileNotFoundError, match="cosearch prepare-relevance"):
        read_relevance_set(path)
    good = {"id": "a", "question": "q", "golden_answers": ["x"], "data_source": "nq",
            "candidates": [{"id": "1", "contents": "x"}], "relevant": [1]}
    cases = [("not json\n", r"set.jsonl.gz:1: not a JSON line"),
             (json.dumps({**good, "relevant": None} | {"relevant": [1, 0]}) + "\n", r":1: 1 candidates but 2 relevance labels"),
             (json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "candidates"}) + "\n",
              r"set.jsonl.gz:2: missing \['candidates'\]")]
    for text, message in cases:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
        with pytest.raises(DataFormatError, match=message):
            read_relevance_set(path)
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(good) + "\n")
    with pytest.raises(DataFormatError, match=r"1 candidates, fewer than the profile's N = 50"):
        read_relevance_set(path, topn=50)

    class Broken(FixedRetriever):  # the server dies after the first batch: the old file stays as it was
        def search(self, queries, topn):
            if self.calls:
                raise ConnectionError("server gone")
            return super().search(queries, topn)

    before = path.read_bytes()
    with pytest.raises(ConnectionError):
        prepare_relevance_set(TRAIN, Broken(CORPUS), 6, path, batch_size=1, progress=False)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["set.jsonl.gz"]
    with pytest.raises(ValueError, match="none of the 1 queries has a relevant passage"):
        prepare_relevance_set(TRAIN[2:], FixedRetriever(CORPUS), 6, path, progress=False)
    assert path.read_bytes() == before
