"""The ceiling of issue 35: the hop-level oracle (a diagnostic ranker) and the questions a paired
comparison needs at a given power."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cosearch_lib.agent.rankers import HopOracleRanker, RankRequest
from cosearch_lib.data.passage import Passage
from cosearch_lib.eval.intervals import questions_for_power
from cosearch_lib.eval.tables import power_table

CHAIN = [("Who directed The Glass Orchard?", "Mara Olsen"), ("Where was Mara Olsen born?", "Velmora")]
CANDIDATES = [Passage("0", '"Glass Orchard"\nA film of 1998.'),
              Passage("1", '"Mara Olsen"\nMara Olsen was born in Velmora.'),
              Passage("2", '"The Glass Orchard"\nThe Glass Orchard was directed by Mara Olsen.'),
              Passage("3", '"Velmora"\nVelmora is a city.')]


def _request(sub_query: str, q0: str = "Where was the director of The Glass Orchard born?") -> RankRequest:
    return RankRequest(q0=q0, sub_query=sub_query, candidates=CANDIDATES, k=2, golds=["Velmora"])


def test_the_hop_oracle_promotes_the_answer_of_the_hop_the_query_asks_for():
    ranker = HopOracleRanker({"Where was the director of The Glass Orchard born?": CHAIN})
    first, second = ranker.rank([_request("director of The Glass Orchard"), _request("Mara Olsen birthplace born")])
    # hop 0: the passages naming Mara Olsen (its answer) first, in retriever order; the final-answer
    # oracle would have put passages 1 and 3 (they hold "Velmora") first instead
    assert first.order == [1, 2]
    assert second.order == [1, 3]  # hop 1: the passages holding "Velmora"


def test_the_hop_oracle_falls_back_to_the_final_answers_without_a_chain_or_a_hop_answer():
    no_chain = HopOracleRanker({})
    assert no_chain.rank([_request("director of The Glass Orchard")])[0].order == [1, 3]  # Eq. 7 on "Velmora"
    missing = HopOracleRanker({"Where was the director of The Glass Orchard born?": [("Who directed it?", "Ivo Brandt")]})
    assert missing.rank([_request("Who directed it?")])[0].order == [1, 3]


def _paired(n_per_family: int, shift: float, noise: float, seed: int, families: int = 4) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    rows = []
    for f in range(families):
        for q in range(n_per_family):
            base = gen.random()
            rows.append({"method": "b", "dataset": f"fam{f}", "question_id": f"{f}-{q}", "sample": 0, "f1": base})
            rows.append({"method": "a", "dataset": f"fam{f}", "question_id": f"{f}-{q}", "sample": 0,
                         "f1": base + shift + gen.normal(0, noise)})
    return pd.DataFrame(rows)


def test_questions_for_power_is_the_normal_formula_and_gives_the_power_it_promises():
    pilot = _paired(400, shift=0.05, noise=0.3, seed=0)
    need = questions_for_power(pilot, "a", "b")
    diffs = (pilot[pilot.method == "a"].set_index("question_id").f1 - pilot[pilot.method == "b"].set_index("question_id").f1)
    by_family = diffs.groupby(pilot[pilot.method == "a"].set_index("question_id").dataset)
    expected = math.ceil(((1.959964 + 0.841621) * math.sqrt(by_family.var().sum()) / 4 / abs(by_family.mean().mean())) ** 2)
    assert need["per_family"] == expected and need["questions"] == 4 * expected
    # at the promised size, a paired z-test on fresh samples of the measured effect rejects ~80% of the time
    n = need["per_family"]
    gen = np.random.default_rng(1)
    d = need["diff"] + gen.normal(0, 1, size=(2000, 4, n)) * np.sqrt(by_family.var().to_numpy())[None, :, None]
    z = d.mean(axis=(1, 2)) / np.sqrt(d.var(axis=2, ddof=1).sum(axis=1) / 16 / n)
    assert 0.75 <= float(np.mean(np.abs(z) > 1.959964)) <= 0.85
    # twice the effect needs about a quarter of the questions
    assert questions_for_power(_paired(400, shift=0.10, noise=0.3, seed=0), "a", "b")["per_family"] < expected / 3


def test_power_table_leaves_out_what_it_cannot_size():
    records = _paired(10, shift=0.1, noise=0.2, seed=0)
    same = records[records.method == "b"].assign(method="c")
    table = power_table(pd.concat([records, same]), [("a", "b"), ("c", "b"), ("a", "missing")])
    assert list(table["a"]) == ["a", "c"]
    assert table["questions_needed"].iloc[0] > 0 and math.isinf(table["questions_needed"].iloc[1])  # c = b: no difference
    with pytest.raises(ValueError, match=">= 2 questions"):
        questions_for_power(_paired(1, shift=0.1, noise=0.2, seed=0), "a", "b")
