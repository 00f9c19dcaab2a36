"""How good is the first-stage retriever? Answer recall@k per question family.

"Answer recall@k" is the QA community's retrieval metric (DPR, Search-R1): the share of questions
for which at least one of the top-k passages contains a gold answer (``metrics.has_answer``). It
is the ceiling a ranker choosing K of N candidates can reach: the gap between recall@N and
recall@K is the room a ranker has. Yes/no questions are left out (a yes/no answer is never
"contained" in a passage), and counted in the ``excluded`` column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cosearch_lib.eval.benchmark_families import hop_group, order_key
from cosearch_lib.metrics import is_trivial_answer, relevance_labels
from cosearch_lib.progress import tqdm

#: Columns of the recall tables (``recall_table``) and of the per-question rank tables.
RECALL_GLOSSARY: dict[str, str] = {
    "R@k": "answer recall@k: share of questions for which at least one of the retriever's top-k passages contains a gold "
           "answer (DPR-style has_answer: NFD, tokenised, case-insensitive token subsequence); yes/no questions are excluded",
    "first_hit_rank": "1-based rank of the first answer-containing passage in the top N (empty when none)",
    "n_relevant": "how many of the top N passages contain a gold answer",
    "single-hop avg / multi-hop avg / avg": "macro averages over families (NQ/TriviaQA/PopQA-like; HotpotQA/2Wiki/MuSiQue/"
                                            "Bamboogle-like; all seven), as in the paper's tables",
}


def _rank_rows(retriever, items: list[dict], *, topn: int, batch_size: int, progress: bool, desc: str) -> list[dict]:
    """Search each item's ``query``; add the first answer-containing rank and the relevant count."""
    out = []
    bar = tqdm(total=len(items), desc=desc, unit="q", disable=not progress)
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        ranked = retriever.search([it["query"] for it in batch], topn)
        for it, passages in zip(batch, ranked):
            labels = np.asarray(relevance_labels([p.contents for p in passages], it.pop("answers")))
            hits = np.flatnonzero(labels)
            out.append({**it, "first_hit_rank": float(hits[0] + 1) if hits.size else np.nan, "n_relevant": int(labels.sum())})
        bar.update(len(batch))
    bar.close()
    return out


def first_relevant_ranks(retriever, examples, *, topn: int, batch_size: int = 64, progress: bool = True) -> pd.DataFrame:
    """One row per question, the question itself as the query: the 1-based rank of the first
    answer-containing passage in the top ``topn`` (NaN when none), and how many contain an answer.

    ``examples`` are ``data.qa_formats.QAExample`` objects (anything with id, question, golden_answers,
    data_source). Yes/no questions are skipped and counted in ``df.attrs["excluded_yes_no"]``.
    """
    items, skipped = [], {}
    for ex in examples:
        if all(is_trivial_answer(a) for a in ex.golden_answers):
            skipped[ex.data_source] = skipped.get(ex.data_source, 0) + 1
            continue
        items.append({"id": ex.id, "data_source": ex.data_source, "group": hop_group(ex.data_source),
                      "query": ex.question, "answers": list(ex.golden_answers)})
    rows = _rank_rows(retriever, items, topn=topn, batch_size=batch_size, progress=progress, desc="retrieve")
    df = pd.DataFrame(rows, columns=["id", "data_source", "group", "query", "first_hit_rank", "n_relevant"])
    df.attrs["excluded_yes_no"] = skipped
    return df


def gold_hop_ranks(retriever, examples, *, topn: int, batch_size: int = 64, progress: bool = True) -> pd.DataFrame:
    """One row per reasoning hop of the embedded world's questions, its gold sub-query as the query.

    This is what the ranker faces inside the agent loop: a well-formed sub-query per hop, and the
    hop's (intermediate) answer as the relevance target. Uses ``extra["extra_info"]["gold_chain"]``
    (world questions only; other data sets have no chain and are skipped).
    """
    items = []
    for ex in examples:
        chain = (ex.extra.get("extra_info") or {}).get("gold_chain") or []
        for h, hop in enumerate(chain):
            if is_trivial_answer(hop["answer"]):
                continue
            items.append({"id": f"{ex.id}#{h}", "data_source": ex.data_source, "group": hop_group(ex.data_source),
                          "hop": h, "query": hop["sub_query"], "answers": [hop["answer"]]})
    rows = _rank_rows(retriever, items, topn=topn, batch_size=batch_size, progress=progress, desc="retrieve hops")
    return pd.DataFrame(rows, columns=["id", "data_source", "group", "hop", "query", "first_hit_rank", "n_relevant"])


def recall_curve(ranks: pd.DataFrame, ks) -> pd.DataFrame:
    """Tidy answer recall@k: one row per (data_source, k), plus the single/multi/all averages.

    Group rows average the per-family recalls (the paper's macro average), not the questions.
    """
    rows = []
    for source, part in ranks.groupby("data_source"):
        r = part["first_hit_rank"].to_numpy()
        for k in ks:
            rows.append({"data_source": source, "group": hop_group(source), "k": int(k),
                         "recall": float(np.mean(np.nan_to_num(r, nan=np.inf) <= k)), "n": len(part)})
    curve = pd.DataFrame(rows)
    if curve.empty:
        return curve
    avgs = []
    for name, sel in (("single-hop avg", curve["group"] == "single"), ("multi-hop avg", curve["group"] == "multi"), ("avg", curve["group"] != "")):
        part = curve[sel]
        if part.empty:
            continue
        agg = part.groupby("k", as_index=False).agg(recall=("recall", "mean"), n=("n", "sum"))
        avgs.append(agg.assign(data_source=name, group="avg"))
    out = pd.concat([curve, *avgs], ignore_index=True)
    return out.sort_values(["group", "data_source", "k"], key=lambda s: s.map(order_key) if s.name == "data_source" else s, ignore_index=True)


def recall_table(curve: pd.DataFrame, ks) -> pd.DataFrame:
    """Wide table: rows = families then averages, columns = recall@k for the chosen ks."""
    wide = curve[curve["k"].isin(list(ks))].pivot_table(index="data_source", columns="k", values="recall")
    wide.columns = [f"R@{k}" for k in wide.columns]
    order = sorted((s for s in wide.index if not s.endswith("avg")), key=order_key)
    order += [s for s in ("single-hop avg", "multi-hop avg", "avg") if s in wide.index]
    return wide.loc[order].round(3)


def ranker_headroom(curve: pd.DataFrame, topn: int, ks) -> pd.DataFrame:
    """For each K in ``ks``: macro-average recall@K, recall@N and the gap, the most a perfect
    ranking of the N candidates can add when the agent reads K (rows: K; from the "avg" rows)."""
    avg = curve[curve["data_source"] == "avg"].set_index("k")["recall"]
    if topn not in avg.index:
        raise ValueError(f"the recall curve has no k = N = {topn}; compute it with ks that include N")
    rows = [{"K": int(k), "R@K": float(avg[k]), f"R@{topn}": float(avg[topn]), "headroom": float(avg[topn] - avg[k])}
            for k in ks if k in avg.index and k <= topn]
    return pd.DataFrame(rows).set_index("K")


def headroom_sentence(headroom: pd.DataFrame, topk: int, topn: int) -> str:
    """Plain words for the profile's choice of K and N, from :func:`ranker_headroom`'s table."""
    if topk not in headroom.index:
        raise ValueError(f"K = {topk} is not a row of the headroom table (rows: {list(headroom.index)})")
    row = headroom.loc[topk]
    others = ", ".join(f"K={k}: +{h:.2f}" for k, h in headroom["headroom"].items() if k != topk)
    return (f"With N={topn} candidates and K={topk} shown, a perfect ranking lifts recall from {row['R@K']:.2f} to "
            f"{row[f'R@{topn}']:.2f} (+{row['headroom']:.2f}); other K: {others or 'none computed'}.")
