"""The ranker that reads (issue 35): the pointwise LLM judge, the listwise identifier-logit ranker,
and their listwise training with its held-out curve."""

from __future__ import annotations

import random

import pytest
import torch

from cosearch_lib.config import ConfigError, LoraSettings, TrainConfig, load_profile
from cosearch_lib.data.passage import make_contents
from cosearch_lib.models.listwise_logits import IDENTIFIERS, ListwiseLogitScorer, listwise_messages
from cosearch_lib.models.llm_judge import LLMJudgeScorer, is_llm_judge_folder, judge_prompt
from cosearch_lib.models.lora_scorer import first_sentence
from cosearch_lib.rl.listwise_training import (
    ListwiseRecipe,
    first_picks,
    hits_at_1,
    train_listwise,
    training_view,
    usable_lists,
)
from cosearch_lib.rl.scorer_policy import RelevanceList
from cosearch_lib.run_schema import latest_checkpoint

from tests import doubles

MODEL = "smollm2-135m-instruct"


class TableScorer(torch.nn.Module):
    """A scorer whose score of a text is a learnable number per text: enough to test the training loop."""

    def __init__(self, texts):
        super().__init__()
        self.index = {t: i for i, t in enumerate(texts)}
        self.values = torch.nn.Parameter(torch.zeros(len(texts)))

    def param_groups(self, lr, head_lr=None):
        return [{"params": [self.values], "lr": lr}]

    def scores(self, query, texts):
        return self.values[[self.index[t] for t in texts]]


class FlatScorer(TableScorer):
    """Its loss cannot move its scores (they do not depend on its parameter): a flat learning curve."""

    def scores(self, query, texts):
        return super().scores(query, texts) * 0.0


def lists(n: int, width: int = 5, seed: int = 0) -> list[RelevanceList]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rel = [0] * width
        rel[rng.randrange(width)] = 1
        out.append(RelevanceList(f"q{i}", [f"q{i} passage {j}" for j in range(width)], rel))
    return out


def test_first_sentence_and_the_judge_prompt_put_the_sub_query_beside_title_and_first_sentence():
    assert first_sentence("Silent Lake is a novel. It sold well.") == "Silent Lake is a novel."
    assert first_sentence("No end here") == "No end here"
    assert first_sentence("Dr. Who? Yes.") == "Dr."  # a plain rule: the first '.', '!' or '?' before a space
    row = make_contents("Silent Lake", "Silent Lake is the work of Treindin Hemwick. The novel is often read.")
    prompt = judge_prompt("who wrote Silent Lake", row, max_chars=200)
    assert prompt == ("Search query: who wrote Silent Lake\nPassage: Silent Lake\nSilent Lake is the work of Treindin "
                      "Hemwick.\nDoes the passage answer the search query? Answer:")
    capped = judge_prompt("q", row, max_chars=12)
    assert "\nSilent Lake…\n" in capped


def test_training_view_keeps_one_relevant_and_samples_negatives_and_usable_lists_drop_what_teaches_nothing():
    lst = RelevanceList("q", [f"t{i}" for i in range(10)], [0, 1, 0, 1, 0, 0, 0, 0, 0, 0])
    rng = random.Random(0)
    for _ in range(20):
        view = training_view(lst, 3, True, rng)
        assert len(view.texts) == 4 and sum(view.relevant) == 1
        assert all(lst.relevant[lst.texts.index(t)] == r for t, r in zip(view.texts, view.relevant))
    whole = training_view(lst, 0, False, rng)
    assert whole.texts == lst.texts and whole.relevant == lst.relevant
    none = RelevanceList("q", ["a", "b"], [0, 0])
    every = RelevanceList("q", ["a", "b"], [1, 1])
    assert usable_lists([lst, none, every]) == [lst]


def test_first_picks_break_ties_towards_the_retrievers_earlier_candidate():
    scorer = TableScorer(["a", "b", "c"])
    with torch.no_grad():
        scorer.values[:] = torch.tensor([0.0, 1.0, 1.0])
    x = RelevanceList("q", ["a", "b", "c"], [0, 0, 1])
    assert first_picks(scorer, [x]) == [1]
    assert hits_at_1(scorer, [x]) == [0.0]


def test_listwise_training_raises_held_out_hit_at_1_and_the_patience_rule_stops_a_flat_curve():
    train = lists(40)
    held = train[:10]  # the table scorer only learns what it sees: held-out items are trained items here
    scorer = TableScorer([t for x in train for t in x.texts])
    points = []
    out = train_listwise(scorer, train, held, ListwiseRecipe(examples=80, batch=2, negatives=2, lr=0.5, eval_every=20,
                                                             patience=0), progress=False, on_point=points.append)
    assert points == out["curve"] and [p["examples"] for p in points] == [0, 20, 40, 60, 80]
    assert points[0]["hit@1"] == pytest.approx(sum(x.relevant[0] for x in held) / 10)  # all scores equal: the first
    assert points[-1]["hit@1"] == 1.0 and out["held_out_hits"] == [1.0] * 10
    assert not out["stopped_early"] and out["trained_lists"] == 80

    frozen = FlatScorer([t for x in train for t in x.texts])
    flat = train_listwise(frozen, train, held, ListwiseRecipe(examples=80, lr=0.5, eval_every=10, patience=30),
                          progress=False)
    assert flat["stopped_early"] and flat["trained_lists"] == 30
    with pytest.raises(ValueError, match="none of the 1 training lists"):
        train_listwise(frozen, [RelevanceList("q", ["a"], [0])], held, ListwiseRecipe(), progress=False)


def test_listwise_messages_give_each_candidate_a_one_letter_identifier_and_repeat_the_sub_query():
    rows = [make_contents(f"T{i}", f"Text {i}. More.") for i in range(3)]
    text = listwise_messages("who wrote X", rows, max_chars=100)[0]["content"]
    assert text.count("who wrote X") == 2 and "[A] T0\nText 0." in text and "[C] T2" in text and "More" not in text
    with pytest.raises(ValueError, match="at most 20"):
        listwise_messages("q", ["x"] * (len(IDENTIFIERS) + 1), max_chars=10)


# ----------------------------------------------------------------------------- the real 135M ranker LLM

SYLLABLES = ["ka", "ren", "dol", "mi", "sar", "tu", "vel", "os", "bri", "an", "gor", "le", "nis", "pa", "quo", "ri"]


def namesake_task(n: int, rng: random.Random) -> list[RelevanceList]:
    """The embedded world's hard case in miniature: "spouse of <name>" against four passages about the
    name and three namesakes one letter apart, in random order; only the exact name's passage answers."""
    def name() -> str:
        return " ".join("".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize() for _ in range(2))

    out = []
    for _ in range(n):
        entity, names = name(), []
        names.append(entity)
        while len(names) < 4:
            i = rng.randrange(len(entity) - 3, len(entity))
            other = entity[:i] + rng.choice([c for c in "aeiouy" if c != entity[i]]) + entity[i + 1:]
            if other not in names:
                names.append(other)
        rng.shuffle(names)
        texts = [make_contents(x, f"{x} was married to {name()}. {x} lived in a small town.") for x in names]
        out.append(RelevanceList(f"spouse of {entity}", texts, [int(x == entity) for x in names]))
    return out


@pytest.fixture(scope="module")
def judge():
    torch.manual_seed(0)
    return LLMJudgeScorer.from_model(MODEL, LoraSettings())


def test_the_judge_scores_a_batch_as_it_scores_each_candidate_alone(judge):
    rows = [make_contents("A", "Short."), make_contents("Bee Cee", "A much longer first sentence about Bee Cee here.")]
    with torch.no_grad():
        batch = judge.scores("who is A", rows)
        alone = torch.cat([judge.scores("who is A", [r]) for r in rows])
    assert torch.allclose(batch, alone, atol=1e-4)  # left padding with its own position ids changes nothing


@pytest.mark.slow  # ~1 min of the 135M judge on one core: make test-slow (CI), not make test
def test_ranker_only_training_of_the_real_judge_raises_held_out_hit_at_1_within_a_few_steps(judge, tmp_path):
    """It fails when the listwise loss cannot move the " Yes" - " No" margin that decides the first pick."""
    rng = random.Random(0)
    train, held = namesake_task(16, rng), namesake_task(16, rng)
    before = {k: v.detach().clone() for k, v in judge.model.named_parameters() if v.requires_grad}
    out = train_listwise(judge, train, held, ListwiseRecipe(examples=16, batch=2, negatives=0, lr=1e-3, eval_every=0,
                                                            patience=0), progress=False)
    start, end = out["curve"][0]["hit@1"], out["curve"][-1]["hit@1"]
    assert end >= start + 0.3 and end >= 0.75, out["curve"]
    moved = [k for k, v in judge.model.named_parameters() if v.requires_grad and not torch.equal(v, before[k])]
    assert moved  # the adapter itself moved: only LoRA tensors are trainable
    assert all("lora_" in k for k in before)
    folder = judge.save(tmp_path / "judge", notes={"trained_lists": 16})
    assert is_llm_judge_folder(folder)
    again = LLMJudgeScorer.load(folder)
    with torch.no_grad():
        assert torch.allclose(again.scores(held[0].query, held[0].texts), judge.scores(held[0].query, held[0].texts),
                              atol=1e-5)


@pytest.mark.slow  # ~1 min of the 135M judge on one core: make test-slow (CI), not make test
def test_ranker_only_grpo_of_the_real_judge_raises_held_out_hit_at_1_within_a_few_steps():
    """Issue 35, item 3: the update CoSearch gives its LLM judge (K picks sampled from the
    Plackett-Luce distribution of its scores, group-relative advantages of r_rel,
    ``scorer_update``) moves the margin that decides the first pick, so held-out Hit@1 on the
    namesake task rises within a few GRPO steps. It fails when the loss cannot move that margin (no
    gradient to the adapter, advantages of the wrong sign, picks whose log-probs do not follow the
    scores). The picks are sampled as ``ScorerPolicyRanker`` samples them, from one scoring of
    each list for its G samples (the ranker scores each request anew: G times the same forward)."""
    from types import SimpleNamespace

    from cosearch_lib.config import GRPOConfig
    from cosearch_lib.metrics import mean_hit
    from cosearch_lib.models.cross_encoder import plackett_luce_logprobs, sample_ranking
    from cosearch_lib.rl.grpo_loss import group_advantages
    from cosearch_lib.rl.scorer_policy import make_optimizer, scorer_update

    torch.manual_seed(0)
    judge = LLMJudgeScorer.from_model(MODEL, LoraSettings())
    rng, gen = random.Random(1), torch.Generator().manual_seed(0)
    train, held = namesake_task(GRPO_LISTS, rng), namesake_task(12, rng)
    optimizer = make_optimizer(judge, GRPO_LR, None)

    def held_out_hit_at_1() -> float:
        with torch.no_grad():
            return sum(x.relevant[int(judge.scores(x.query, x.texts).argmax())] for x in held) / len(held)

    start = held_out_hit_at_1()
    for step in range(GRPO_STEPS):
        calls, rewards = [], []
        for x in train:
            with torch.no_grad():
                scores = judge.scores(x.query, x.texts)
            for _ in range(GRPO_G):
                order = sample_ranking(scores, 2, 1.0, gen)
                calls.append(SimpleNamespace(sub_query=x.query, candidate_texts=x.texts, order=order,
                                             output_logprobs=plackett_luce_logprobs(scores, order, 1.0).tolist()))
                rewards.append(mean_hit([x.relevant[i] for i in order], (1, 3, 5)))
        groups = torch.tensor([j for j in range(len(train)) for _ in range(GRPO_G)])
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), groups).tolist()
        stats = scorer_update(judge, optimizer, calls, advantages, GRPOConfig(), temperature=1.0, max_grad_norm=1.0)
        assert stats["ranker_n_forwarded"] > 0 and stats["grad_norm"] > 0, (step, stats)
        assert abs(stats["ranker_ratio_mean"] - 1.0) < 1e-3  # the picks' log-probs are the judge's own
    end = held_out_hit_at_1()
    assert end >= start + 0.25, (start, end)


#: The ranker-only GRPO test's budget: lists per step, samples per list (G), steps, the judge's learning rate.
GRPO_LISTS, GRPO_G, GRPO_STEPS, GRPO_LR = 4, 4, 4, 3e-3


def test_the_listwise_logit_ranker_reads_one_identifier_logit_per_candidate():
    scorer = ListwiseLogitScorer.from_model(MODEL, LoraSettings())
    rows = [make_contents(f"T{i}", f"Text {i}.") for i in range(5)]
    ids = scorer.prompt_ids("q", rows)
    assert scorer.tokenizer.decode(ids[-len(scorer.opening_ids):]) == "<rerank>["
    with torch.no_grad():
        s = scorer.scores("q", rows)
        logits = scorer.model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert s.shape == (5,) and torch.allclose(s, logits[scorer.identifier_ids[:5]])
    # a checkpoint keeps the adapter's tensors, not the base model's, and loads them back
    state = scorer.state_dict()
    assert state and all("lora_" in k for k in state)
    assert len(state) < sum(1 for _ in scorer.model.parameters())
    moved = {k: v + 1.0 for k, v in state.items()}
    scorer.load_state_dict(moved)
    assert all(torch.equal(v, moved[k]) for k, v in scorer.state_dict().items())
    with pytest.raises(ValueError, match="0 unknown and 1 missing adapter tensors"):
        scorer.load_state_dict(dict(list(moved.items())[1:]))


# ----------------------------------------------------------------------------- the judge as the ranker policy of a run


def tiny_judge(tok, seed: int = 1) -> LLMJudgeScorer:
    from peft import get_peft_model

    from cosearch_lib.models.llm_judge import JUDGE_ADAPTER
    from cosearch_lib.models.lora_policies import peft_lora_config

    model = get_peft_model(doubles.tiny_model(tok, seed=seed), peft_lora_config(LoraSettings(r=4, alpha=8)),
                           adapter_name=JUDGE_ADAPTER)
    with torch.no_grad():  # LoRA B away from zero: the judge's scores differ from the start
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    return LLMJudgeScorer(model, tok, source="tiny", max_chars=60, max_length=48)


def test_the_llm_judge_kind_is_a_scoring_ranker_without_a_ranker_adapter():
    cfg = TrainConfig(method="cosearch", ranker_kind="llm_judge")
    assert cfg.roles() == {"agent": "agent", "ranker": None} and cfg.uses_scoring_ranker
    assert cfg.scoring_ranker_lr == (cfg.llm_judge.lr, None)
    assert cfg.spec.evaluated_as(cfg.ranker_kind) == "agent_scorer"
    with pytest.raises(ValueError, match="shared backbone"):
        TrainConfig(ranker_kind="llm_judge", shared_backbone=True)
    with pytest.raises(ConfigError, match="training.llm_judge.negatives"):
        load_profile("ci", training={"llm_judge": {"negatives": -1}})


def test_cosearch_trains_the_llm_judge_with_grpo_and_resumes_it_from_a_checkpoint(tok, tmp_path):
    def built(out):
        return doubles.trainer(tok, doubles.tiny_model(tok), out, steps=2, ranker_kind="llm_judge",
                               scorer=tiny_judge(tok))

    start = tiny_judge(tok).state_dict()
    full = built(tmp_path / "full")
    full.run()
    assert full.frame()["loss/ranker_n_forwarded"].sum() > 0  # the judge got gradient ...
    end = full.scorer.state_dict()
    assert set(end) == set(start) and all("lora_" in k for k in end)  # (a checkpoint keeps the adapter only)
    assert any(not torch.equal(start[k], end[k]) for k in end)  # ... and its adapter moved
    ckpt = latest_checkpoint(tmp_path / "full")
    assert is_llm_judge_folder(ckpt / "adapters" / "scorer") and not (ckpt / "adapters" / "ranker").exists()
    half = built(tmp_path / "half")
    half.run(1)
    resumed = built(tmp_path / "half")
    resumed.load_checkpoint()
    resumed.run()
    cols = ["rollout/agent_reward", "ranker/hit@K", "ranker/reward_pre", "loss/ranker_loss"]
    assert resumed.frame()[cols].equals(full.frame()[cols])
    assert all(torch.equal(a, end[k]) for k, a in resumed.scorer.state_dict().items())
