"""Hand-worked checks of cosearch_lib.metrics, plus comparisons with small independent re-implementations."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from cosearch_lib import metrics as M

L3 = math.log2(3)  # discount of rank 2
L4 = math.log2(4)  # discount of rank 3 (= 2)
L5 = math.log2(5)  # discount of rank 4


# --------------------------------------------------------------------------- normalize_answer


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The Quick, Brown Fox!", "quick brown fox"),  # lower, drop ",", "!", drop "the"
        ("an apple a day", "apple day"),  # all three articles go
        ("Theatre Anne banana", "theatre anne banana"),  # articles only as whole words
        ("U.S.A.", "usa"),  # punctuation is deleted, not replaced by a space
        ("don't", "dont"),
        # punctuation goes *before* articles: "the-end" -> "theend", which is no longer an article
        ("the-end", "theend"),
        ("  many \t spaces\nand\nlines  ", "many spaces and lines"),
        ("A", ""),
        ("“Quoted”", "“quoted”"),  # only ASCII punctuation is removed (SQuAD's string.punctuation)
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert M.normalize_answer(raw) == expected


# --------------------------------------------------------------------------- exact_match


def test_exact_match_basic_and_golds_forms():
    assert M.exact_match("The Beatles", ["beatles"]) == 1.0  # "beatles" == "beatles"
    assert M.exact_match("Beatles band", "The Beatles") == 0.0  # "beatles band" != "beatles"
    golds = ["London", "Paris, France", "PARIS"]
    assert M.exact_match("paris", golds) == 1.0  # matches the third gold
    assert M.exact_match("paris", tuple(golds)) == 1.0
    assert M.exact_match("paris", np.array(golds, dtype=object)) == 1.0
    assert M.exact_match("paris", np.array(golds)) == 1.0  # numpy unicode array (np.str_)
    assert M.exact_match("Paris France", golds) == 1.0  # "paris france" after "," is deleted
    assert M.exact_match("Lyon", golds) == 0.0


def test_exact_match_edge_cases():
    assert M.exact_match(None, "x") == 0.0
    assert M.exact_match("x", []) == 0.0
    # SQuAD convention: both sides normalise to "" -> equal
    assert M.exact_match("the", "a") == 1.0
    with pytest.raises(TypeError):
        M.exact_match("x", ["ok", None])
    with pytest.raises(TypeError):
        M.exact_match("x", None)


# --------------------------------------------------------------------------- token_f1


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        # pred [quick brown fox] (3), gold [quick fox jumps] (3), overlap 2: P 2/3, R 2/3 -> 2/3
        ("the quick brown fox", "quick fox jumps", 2 / 3),
        # pred [barack obama], gold [obama]: P 1/2, R 1 -> 2*(1/2)/(3/2) = 2/3
        ("Barack Obama", "Obama", 2 / 3),
        # multiset: pred [new new york] gold [new york]; overlap min(2,1)+1 = 2: P 2/3, R 1 -> 0.8
        ("new new york", "new york", 0.8),
        # pred [new york new york] gold [new york]: overlap 2, P 2/4, R 1 -> 2/3
        ("New York, New York", "new york", 2 / 3),
        ("U.S.", "US", 1.0),  # "us" vs "us"
        ("The Eiffel Tower.", "eiffel tower", 1.0),
        ("Lyon", "Paris", 0.0),  # no overlap
        # pred [a1 b c] gold [b c d e]: overlap 2, P 2/3, R 2/4 -> 2*(1/3)/(7/6) = 4/7
        ("a1 b c", "b c d e", 4 / 7),
    ],
)
def test_token_f1_worked(pred, gold, expected):
    assert M.token_f1(pred, gold) == pytest.approx(expected)


def test_token_f1_yes_no_rule():
    assert M.token_f1("yes", "Yes.") == 1.0  # same after normalisation
    # rule on: gold "yes" differs from "yes it is" -> 0
    assert M.token_f1("yes it is", "yes") == 0.0
    # rule off: P 1/3, R 1 -> 2*(1/3)/(4/3) = 0.5
    assert M.token_f1("yes it is", "yes", yes_no_rule=False) == pytest.approx(0.5)
    # prediction side: pred "no" vs gold "no way" -> 0; without rule P 1, R 1/2 -> 2/3
    assert M.token_f1("No", "no way") == 0.0
    assert M.token_f1("No", "no way", yes_no_rule=False) == pytest.approx(2 / 3)
    # "noanswer" differs from "no answer" -> 0 (and would be 0 anyway: no shared token)
    assert M.token_f1("noanswer", "no answer") == 0.0
    assert M.token_f1("noanswer", "No answer!", yes_no_rule=False) == 0.0
    # "true"/"false" are not part of the F1 rule: pred [true story] gold [true]: P 1/2, R 1 -> 2/3
    assert M.token_f1("true story", "true") == pytest.approx(2 / 3)


def test_token_f1_empty_and_none():
    assert M.token_f1("", "x") == 0.0
    assert M.token_f1("the", "x") == 0.0  # normalises to ""
    assert M.token_f1("!!!", "the") == 0.0
    assert M.token_f1("", "") == 0.0  # unlike exact_match, both-empty is 0
    assert M.token_f1("x", "") == 0.0
    assert M.token_f1(None, "x") == 0.0
    with pytest.raises(TypeError):
        M.token_f1("x", ["x"])  # several golds -> max_token_f1


def test_max_token_f1():
    golds = ["Obama", "Barack Hussein Obama", "Michelle"]
    # "Obama": 2/3; "Barack Hussein Obama": overlap 2, P 2/2, R 2/3 -> 0.8; "Michelle": 0 -> max 0.8
    assert M.max_token_f1("Barack Obama", golds) == pytest.approx(0.8)
    assert M.max_token_f1("Barack Obama", tuple(golds)) == pytest.approx(0.8)
    assert M.max_token_f1("Barack Obama", np.array(golds, dtype=object)) == pytest.approx(0.8)
    assert M.max_token_f1("Barack Obama", "Obama") == pytest.approx(2 / 3)
    assert M.max_token_f1("Barack Obama", []) == 0.0
    assert M.max_token_f1(None, golds) == 0.0
    # the rule is applied per gold: "yes" vs ["yes", "yes indeed"] -> max(1, 0) = 1
    assert M.max_token_f1("yes", ["yes indeed", "yes"]) == 1.0
    assert M.max_token_f1("yes indeed", ["yes"]) == 0.0
    assert M.max_token_f1("yes indeed", ["yes"], yes_no_rule=False) == pytest.approx(2 / 3)


def _reference_f1(pred: str, gold: str) -> float:
    """Second implementation: no Counter, match tokens one by one from a sorted copy."""
    p = M.normalize_answer(pred).split()
    g = M.normalize_answer(gold).split()
    remaining = sorted(g)
    shared = 0
    for tok in sorted(p):
        if tok in remaining:
            remaining.remove(tok)
            shared += 1
    if shared == 0:
        return 0.0
    precision, recall = shared / len(p), shared / len(g)
    return 2 * precision * recall / (precision + recall)


def _random_phrase(rnd: random.Random) -> str:
    vocab = ["the", "a", "An", "Paris", "paris,", "New", "york", "York.", "yes", "no", "1843", "x", "U.S.", "-", "!"]
    return " ".join(rnd.choice(vocab) for _ in range(rnd.randint(0, 6)))


def test_token_f1_matches_independent_implementation():
    rnd = random.Random(1234)
    for _ in range(2000):
        pred, gold = _random_phrase(rnd), _random_phrase(rnd)
        assert M.token_f1(pred, gold, yes_no_rule=False) == pytest.approx(_reference_f1(pred, gold), abs=1e-12)
        got = M.token_f1(pred, gold)
        np_, ng = M.normalize_answer(pred), M.normalize_answer(gold)
        if np_ != ng and ({np_, ng} & {"yes", "no", "noanswer"}):
            assert got == 0.0
        else:
            assert got == pytest.approx(_reference_f1(pred, gold), abs=1e-12)


# --------------------------------------------------------------------------- query_token_f1


def test_normalize_query():
    # lower, drop articles, punctuation -> space, collapse
    assert M.normalize_query("Who directed The film 'Titanic'?") == "who directed film titanic"
    assert M.normalize_query("U.S. president") == "u s president"  # vs normalize_answer: "us president"
    assert M.normalize_answer("U.S. president") == "us president"
    assert M.normalize_query("Obama's birthplace") == "obama s birthplace"
    assert M.normalize_query("“Zoë” – Škoda") == "zoë škoda"  # unicode punctuation -> space, letters kept
    assert M.normalize_query("the_cat") == "the_cat"  # "_" is a word character: not punctuation
    assert M.normalize_query("  ") == ""


def test_query_token_f1_worked():
    # [who directed film titanic] (4) vs [titanic film director] (3): overlap 2 -> P 2/4, R 2/3
    # F1 = 2*(1/2)(2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7
    a, b = "who directed the film Titanic?", "Titanic film director"
    assert M.query_token_f1(a, b) == pytest.approx(4 / 7)
    assert M.query_token_f1(b, a) == M.query_token_f1(a, b)
    # punctuation -> spaces makes these identical: [u s president]
    assert M.query_token_f1("U.S. president", "u s president") == 1.0
    assert M.query_token_f1("The Who band", "who band") == 1.0  # articles dropped
    # 4 shared of 5 + 5 tokens -> exactly 0.8, so it clears the delta = 0.8 threshold
    f = M.query_token_f1("when was the eiffel tower built", "when was eiffel tower constructed")
    assert f == 0.8 and f >= 0.8
    # 6 shared of 7 + 8 tokens: 2*6/15 = 0.8 exactly (2PR/(P+R) in floats gives 0.7999999999999999)
    q7 = "alpha beta gamma delta epsilon zeta eta"
    q8 = "alpha beta gamma delta epsilon zeta theta iota"
    assert M.query_token_f1(q7, q8) >= 0.8
    # no yes/no rule for queries: [yes it is] vs [yes] -> P 1/3, R 1 -> 0.5
    assert M.query_token_f1("yes it is", "yes") == pytest.approx(0.5)


def test_query_token_f1_empty():
    assert M.query_token_f1("", "") == 0.0
    assert M.query_token_f1("the a an", "x") == 0.0
    assert M.query_token_f1("?!", "?!") == 0.0
    assert M.query_token_f1("the_cat", "the cat") == 0.0  # "the_cat" vs "cat"


def test_query_token_f1_symmetric_and_bounded_random():
    rnd = random.Random(7)
    for _ in range(1000):
        a, b = _random_phrase(rnd), _random_phrase(rnd)
        f_ab, f_ba = M.query_token_f1(a, b), M.query_token_f1(b, a)
        assert f_ab == f_ba
        assert 0.0 <= f_ab <= 1.0
        if M.normalize_query(a):
            assert M.query_token_f1(a, a) == 1.0


# --------------------------------------------------------------------------- has_answer


def test_simple_tokenize():
    assert M.simple_tokenize("U.S. $5, New-York") == ["U", ".", "S", ".", "$", "5", ",", "New", "-", "York"]
    assert M.simple_tokenize("a\tb\u200bc") == ["a", "b", "c"]  # tab and zero-width space separate
    assert M.simple_tokenize("Zoë", lowercase=True) == ["zoë"]
    assert M.simple_tokenize("") == []


def test_has_answer_token_boundaries():
    assert M.has_answer("He moved to Paris.", ["Paris"])  # "." is its own token
    assert not M.has_answer("Parisian cuisine is famous.", ["Paris"])
    assert M.has_answer("She lived in New York City for years.", ["New York"])
    assert not M.has_answer("She lived in York, then New Jersey.", ["New York"])
    assert not M.has_answer("York New", ["New York"])  # order matters
    assert M.has_answer("Born in 1843 in Lyon.", ["1843"])
    assert not M.has_answer("Code 18435 again.", ["1843"])
    assert not M.has_answer("It sold 1,843 copies.", ["1843"])  # tokens 1 , 843
    assert M.has_answer("the U.S. army", ["U.S."])
    assert not M.has_answer("the US army", ["U.S."])
    assert M.has_answer("Jean-Paul Sartre", ["Jean - Paul"])  # same tokens: jean - paul
    assert not M.has_answer("Paris", ["Paris France"])  # answer longer than text


def test_has_answer_case_and_unicode():
    assert M.has_answer("paris is big", ["PARIS"])
    nfc_zoe = unicodedata.normalize("NFC", "Zoë")
    nfd_zoe = unicodedata.normalize("NFD", "Zoë")
    assert nfc_zoe != nfd_zoe  # really two code point sequences
    assert M.has_answer(f"Actress {nfd_zoe} Saldana", [nfc_zoe])
    assert M.has_answer(f"Actress {nfc_zoe} Saldana", [nfd_zoe])
    assert M.has_answer(f"ACTRESS {nfc_zoe.upper()} SALDANA", [nfd_zoe])
    nfc_skoda = unicodedata.normalize("NFC", "Škoda")
    nfd_skoda = unicodedata.normalize("NFD", "Škoda")
    assert len(nfc_skoda) == 5 and len(nfd_skoda) == 6
    assert M.has_answer(f"{nfd_skoda} Auto is a carmaker", nfc_skoda)
    assert M.has_answer(f"{nfc_skoda} Auto is a carmaker", nfd_skoda)
    # accents are not stripped: "Zoe" is a different token from "Zoë"
    assert not M.has_answer(f"Actress {nfc_zoe} Saldana", ["Zoe"])
    assert not M.has_answer("Actress Zoe Saldana", [nfc_zoe])


def test_has_answer_trivial_and_multiple():
    text = "Yes, it is true; no doubt, that was false."
    assert not M.has_answer(text, ["yes"])
    assert not M.has_answer(text, ["Yes."])  # normalises to "yes"
    assert not M.has_answer(text, ["yes", "no", "TRUE", "false"])  # all trivial -> False
    assert not M.has_answer(text, "no")
    assert M.has_answer("yes, Paris", ["yes", "Paris"])  # Paris counts
    assert not M.has_answer("yes, Paris", ["yes", "London"])  # "yes" never counts
    assert M.has_answer("The capital is Lyon.", ["Paris", "Lyon"])  # any answer
    assert M.has_answer("The capital is Lyon.", np.array(["Paris", "Lyon"]))
    assert not M.has_answer("anything", [])
    assert not M.has_answer("anything", ["", "   "])  # no tokens -> never contained
    assert not M.has_answer("", ["Paris"])


def test_is_trivial_answer():
    for a in ["yes", "Yes", " no ", "TRUE.", "False!", "The yes"]:
        assert M.is_trivial_answer(a), a
    for a in ["Yesterday", "no way", "nothing", "truely", "", "noanswer"]:
        assert not M.is_trivial_answer(a), a


def test_relevance_labels():
    passages = ["Paris is the capital.", "Parisian food.", "Lyon and PARIS.", ""]
    assert M.relevance_labels(passages, ["Paris"]) == [1, 0, 1, 0]
    assert M.relevance_labels(passages, ["yes"]) == [0, 0, 0, 0]
    assert M.relevance_labels([], ["Paris"]) == []
    assert M.relevance_labels(np.array(passages), "paris") == [1, 0, 1, 0]
    # must agree with has_answer passage by passage
    answers = ["Lyon", "no"]
    assert M.relevance_labels(passages, answers) == [int(M.has_answer(p, answers)) for p in passages]


def _ref_tokens(text: str) -> list[str]:
    """Second tokenizer, by Unicode category per character (L/N/M runs, else single non-Z/C chars)."""
    out: list[str] = []
    run = ""
    for ch in unicodedata.normalize("NFD", text):
        cat = unicodedata.category(ch)[0]
        if cat in "LNM":
            run += ch
            continue
        if run:
            out.append(run)
            run = ""
        if cat not in "ZC":
            out.append(ch)
    if run:
        out.append(run)
    return [t.lower() for t in out]


def _ref_has_answer(text: str, answers: list[str]) -> bool:
    """Second containment check: sentinel-joined substring search."""
    sep = "\x00"
    hay = sep + sep.join(_ref_tokens(text)) + sep
    for a in answers:
        if M.normalize_answer(a) in {"yes", "no", "true", "false"}:
            continue
        toks = _ref_tokens(a)
        if toks and (sep + sep.join(toks) + sep) in hay:
            return True
    return False


def test_has_answer_matches_independent_implementation():
    rnd = random.Random(99)
    pieces = ["Paris", "paris", "Parisian", "New", "York", "1843", "18435", "Zoë",
              unicodedata.normalize("NFD", "Zoë"), "Škoda", "yes", "no", "-", ".", ",", "U.S.", "a", "the"]
    seps = [" ", "  ", "\t", "\n", "", "-", "\u00a0"]
    for _ in range(1500):
        text = "".join(rnd.choice(pieces) + rnd.choice(seps) for _ in range(rnd.randint(0, 8)))
        answers = [
            "".join(rnd.choice(pieces) + rnd.choice(seps) for _ in range(rnd.randint(0, 2)))
            for _ in range(rnd.randint(0, 3))
        ]
        assert M.has_answer(text, answers) == _ref_has_answer(text, answers), (text, answers)


# --------------------------------------------------------------------------- ranking metrics


def test_hit_at_k_boundaries():
    labels = [0, 0, 1, 0, 0]
    assert M.hit_at_k(labels, 1) == 0.0
    assert M.hit_at_k(labels, 2) == 0.0
    assert M.hit_at_k(labels, 3) == 1.0  # first relevant at rank 3
    assert M.hit_at_k(labels, 10) == 1.0  # k > len -> whole list
    assert M.hit_at_k([1], 1) == 1.0
    assert M.hit_at_k([], 5) == 0.0
    assert M.hit_at_k([False, True], 2) == 1.0
    assert M.hit_at_k(np.array([0, 1]), 1) == 0.0
    assert M.hit_at_k(np.array([False, True]), 2) == 1.0
    assert M.recall_at_k(labels, 3) == 1.0 and M.recall_at_k(labels, 2) == 0.0


@pytest.mark.parametrize("fn", [M.hit_at_k, M.recall_at_k, M.ndcg_at_k])
def test_k_validation(fn):
    for bad in (0, -1):
        with pytest.raises(ValueError, match="k must be >= 1"):
            fn([1, 0], bad)
    with pytest.raises(TypeError):
        fn([1, 0], 1.5)
    with pytest.raises(TypeError):
        fn([1, 0], True)
    assert fn([1, 0], np.int64(1)) == 1.0


@pytest.mark.parametrize("bad", [[0, 2], [0.0, 1.0], ["1"], [None], [-1]])
def test_label_validation(bad):
    for fn in (lambda labels: M.hit_at_k(labels, 1), lambda labels: M.ndcg_at_k(labels, 1), M.mean_hit):
        with pytest.raises(ValueError, match="0/1"):
            fn(bad)
    with pytest.raises(TypeError):
        M.hit_at_k("0101", 2)


def test_mean_hit():
    # Hit@1 0, Hit@3 1, Hit@5 1 -> 2/3
    assert M.mean_hit([0, 0, 1, 0, 0]) == pytest.approx(2 / 3)
    assert M.mean_hit([1, 0, 0, 0, 0]) == 1.0
    # relevant at rank 4: Hit@1 0, Hit@3 0, Hit@5 1 -> 1/3
    assert M.mean_hit([0, 0, 0, 1, 0]) == pytest.approx(1 / 3)
    assert M.mean_hit([0, 0, 0, 0, 0]) == 0.0
    assert M.mean_hit([0, 0, 0, 0, 0, 1]) == 0.0  # rank 6 is beyond every cutoff
    assert M.mean_hit([]) == 0.0
    # custom cutoffs: rank 2 -> Hit@1 0, Hit@2 1 -> 0.5
    assert M.mean_hit([0, 1], ks=(1, 2)) == 0.5
    with pytest.raises(ValueError):
        M.mean_hit([1], ks=())
    with pytest.raises(ValueError):
        M.mean_hit([1], ks=(0, 1))


def test_ndcg_hand_values():
    # [0,1,0,1], k=4: DCG = 1/log2(3) + 1/log2(5); IDCG ([1,1,0,0]) = 1 + 1/log2(3)
    expected = (1 / L3 + 1 / L5) / (1 + 1 / L3)  # 1.0616 / 1.6309 = 0.6509
    assert M.ndcg_at_k([0, 1, 0, 1], 4) == pytest.approx(expected)
    assert expected == pytest.approx(0.65092, abs=1e-5)
    # k=2: DCG = 1/log2(3); IDCG = 1 + 1/log2(3) (two relevant in the list) -> 0.3869
    assert M.ndcg_at_k([0, 1, 0, 1], 2) == pytest.approx((1 / L3) / (1 + 1 / L3))
    assert M.ndcg_at_k([1, 0, 0], 3) == 1.0
    assert M.ndcg_at_k([1, 1, 0], 3) == 1.0
    # [0,0,1], k=3: DCG = 1/log2(4) = 0.5; IDCG = 1 -> 0.5
    assert M.ndcg_at_k([0, 0, 1], 3) == pytest.approx(0.5)
    assert M.ndcg_at_k([0, 0, 1], 2) == 0.0  # relevant item below the cutoff, IDCG@2 = 1
    assert M.ndcg_at_k([0, 0, 0], 3) == 0.0  # no relevant item
    assert M.ndcg_at_k([], 5) == 0.0
    # k > len: [0,1], k=10 -> DCG 1/log2(3), IDCG 1
    assert M.ndcg_at_k([0, 1], 10) == pytest.approx(1 / L3)
    assert M.ndcg_at_k([False, True], 2) == pytest.approx(1 / L3)


def test_ndcg_with_pool_ideal():
    # ranked [0,1,0,0,0], pool of N candidates with 3 relevant:
    # DCG = 1/log2(3); IDCG@5 = 1 + 1/log2(3) + 1/log2(4) = 2.1309 -> 0.2961
    ranked = [0, 1, 0, 0, 0]
    pool = [0, 0, 1, 0, 1, 0, 1, 0]
    assert M.ndcg_at_k(ranked, 5, ideal_labels=pool) == pytest.approx((1 / L3) / (1 + 1 / L3 + 1 / L4))
    assert M.ndcg_at_k(ranked, 5) == pytest.approx(1 / L3)  # default: ideal from the list itself
    assert M.ndcg_at_k(ranked, 5, ideal_labels=[0] * 8) == 0.0


def _ref_ndcg(labels: list[int], k: int) -> float:
    dcg = 0.0
    for rank in range(1, min(k, len(labels)) + 1):
        dcg += labels[rank - 1] / math.log2(rank + 1)
    n_rel = min(sum(labels), k)
    idcg = sum(1 / math.log2(rank + 1) for rank in range(1, n_rel + 1))
    return dcg / idcg if idcg else 0.0


def test_ranking_metrics_match_reference_random():
    rnd = random.Random(3)
    for _ in range(500):
        labels = [rnd.randint(0, 1) for _ in range(rnd.randint(0, 8))]
        k = rnd.randint(1, 10)
        assert M.ndcg_at_k(labels, k) == pytest.approx(_ref_ndcg(labels, k), abs=1e-12)
        first = next((i + 1 for i, v in enumerate(labels) if v), None)
        assert M.hit_at_k(labels, k) == float(first is not None and first <= k)
        assert M.mean_hit(labels) == pytest.approx(sum(M.hit_at_k(labels, c) for c in (1, 3, 5)) / 3)


# --------------------------------------------------------------------------- module hygiene


def test_module_does_not_import_torch():
    code = "import sys, cosearch_lib.metrics; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_functions_documented():
    for name in M.__all__:
        obj = getattr(M, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name
