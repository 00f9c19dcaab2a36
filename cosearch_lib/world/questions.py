"""Questions in the Search-R1 row schema: seven families mirroring the paper's seven benchmarks.

Each question carries ``extra_info.gold_chain``: per reasoning hop a natural search query (the
"gold sub-query"), the hop's answer and the ids of the passages stating it. Namesakes are always
disambiguated ("the composer Aldric Venn"), so no question is ambiguous.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cosearch_lib.seeding import derive_seed
from cosearch_lib.world.built_world import World
from cosearch_lib.world.entities import ASKABLE, WORK_KINDS, Entity, aliases, answers
from cosearch_lib.world.families import FAMILIES, TYPES
from cosearch_lib.world.text import slots

# Natural search-style phrasings per relation; the first one also phrases gold sub-queries.
# {X}: the subject; work-only slots {made} {role} {released} {kind} come from the subject work.
_NQ_Q: dict[str, list[str]] = {
    "birth_year": ["when was {X} born", "what year was {X} born in", "{X} year of birth"],
    "birthplace": ["where was {X} born", "what city was {X} born in", "{X} place of birth"],
    "occupation": ["what was the occupation of {X}", "what did {X} do for a living", "{X} profession"],
    "nationality": ["which country was {X} a citizen of", "what country was {X} from", "{X} nationality"],
    "spouse": ["who was {X} married to", "who did {X} marry", "who was the spouse of {X}"],
    "member_of": ["which organisation did {X} work for", "where did {X} work", "{X} employer"],
    "founded_year": ["when was {X} founded", "what year was {X} established", "{X} year founded"],
    "founded_by": ["who founded {X}", "who started {X}", "founder of {X}"],
    "headquarters": ["where is {X} headquartered", "where is {X} based", "{X} headquarters location"],
    "country": ["which country is {X} in", "where is {X} located", "{X} is in which country"],
    "population": ["what is the population of {X}", "how many people live in {X}", "{X} population"],
    "capital": ["what is the capital of {X}", "capital city of {X}", "which city is the capital of {X}"],
    "language": ["what is the official language of {X}", "what language do they speak in {X}", "{X} official language"],
    "year": ["when was {X} {released}", "what year did {X} come out", "{X} release year"],
    "creator": ["who {made} {X}", "who is the {role} of {X}", "{X} {role}"],
    "genre": ["what genre is {X}", "what kind of {kind} is {X}", "{X} genre"],
}
# PopQA: exactly one template per relation.
_POPQA_Q = {"birth_year": "In what year was {X} born?", "birthplace": "In what city was {X} born?",
            "occupation": "What is {X}'s occupation?", "nationality": "What country is {X} a citizen of?",
            "spouse": "Who is {X}'s spouse?", "member_of": "What organisation does {X} work for?",
            "founded_year": "In what year was {X} founded?", "founded_by": "Who was the founder of {X}?",
            "headquarters": "In what city is {X} headquartered?", "country": "In what country is {X}?",
            "population": "What is the population of {X}?", "capital": "What is the capital of {X}?",
            "language": "What is the official language of {X}?", "year": "In what year was {X} {released}?",
            "creator": "Who was the {role} of {X}?", "genre": "What genre is {X}?"}
# Multi-hop: question about a described subject {X} (e.g. "the author of 'The Glass Orchard'").
_MULTI_Q = {"birth_year": ["When was {X} born?", "In what year was {X} born?"],
            "birthplace": ["Where was {X} born?", "In which city was {X} born?"],
            "occupation": ["What was the occupation of {X}?", "What did {X} do for a living?"],
            "nationality": ["Which country was {X} a citizen of?", "What was the nationality of {X}?"],
            "spouse": ["Who was {X} married to?", "Who was the spouse of {X}?"],
            "member_of": ["Which organisation did {X} work for?"],
            "founded_year": ["When was {X} founded?", "In what year was {X} established?"],
            "founded_by": ["Who founded {X}?"],
            "headquarters": ["Where is {X} headquartered?", "In which city is {X} based?"],
            "country": ["In which country is {X}?", "{Xc} lies in which country?"],
            "capital": ["What is the capital of {X}?"],
            "language": ["What is the official language of {X}?"]}
# Bamboogle: fronted, indirect phrasings.
_HARD_Q = {"birth_year": ["{Xc} was born in what year?", "In what year did {X} come into the world?"],
           "birthplace": ["{Xc} was born in which city?", "Which city is the birthplace of {X}?"],
           "occupation": ["What line of work was {X} in?", "{Xc} worked in which profession?"],
           "spouse": ["Who did {X} marry?", "{Xc} was married to whom?"],
           "founded_year": ["{Xc} came into being in what year?", "{Xc} was founded in which year?"],
           "nationality": ["{Xc} held the citizenship of which country?"]}
# (last two relations) -> a shorter phrasing that still needs both hops.
_FINAL2 = {("birthplace", "country"): ["In which country was {X} born?", "{Xc} was born in which country?"],
           ("headquarters", "country"): ["In which country is {X} headquartered?"],
           ("country", "capital"): ["What is the capital of the country where {X} is located?"],
           ("country", "language"): ["What is the official language of the country where {X} is located?"]}
# Two consecutive bridge relations -> one noun phrase (still two lookups).
_BRIDGE2 = {("birthplace", "country"): "the country where {X} was born",
            ("headquarters", "country"): "the country where {X} is headquartered"}
_BRIDGE = {"creator": "the {role} of {X}", "birthplace": "the city where {X} was born",
           "member_of": "the organisation {X} worked for", "founded_by": "the founder of {X}",
           "headquarters": "the city where {X} is headquartered", "country": "the country that {X} is in",
           "capital": "the capital of {X}", "spouse": "the spouse of {X}",
           "nationality": "the country {X} was a citizen of"}
_HARD_BRIDGE = dict(_BRIDGE, creator="the person who {made} {X}", birthplace="the birthplace of {X}",
                    member_of="the organisation that employed {X}", founded_by="the person who founded {X}",
                    spouse="the person {X} married")
_TYPE_WEIGHTS = {"person": 0.4, "work": 0.3, "org": 0.15, "city": 0.1, "country": 0.05}
_HOTPOT_SPECS = [("work", ("creator", "birthplace")), ("work", ("creator", "member_of")),
                 ("org", ("founded_by", "birth_year")), ("person", ("member_of", "headquarters")),
                 ("city", ("country", "capital")), ("org", ("headquarters", "country")),
                 ("person", ("spouse", "occupation"))]
_2WIKI_SPECS = [("work", ("creator", "spouse")), ("person", ("spouse", "birth_year")),
                ("org", ("founded_by", "nationality")), ("person", ("birthplace", "founded_year")),
                ("work", ("creator", "nationality"))]
_MUSIQUE_SPECS = [("work", ("creator", "birthplace", "country")), ("work", ("creator", "member_of", "headquarters")),
                  ("person", ("member_of", "founded_by", "birth_year")), ("org", ("founded_by", "birthplace", "country")),
                  ("work", ("creator", "spouse", "birth_year")), ("person", ("birthplace", "country", "capital")),
                  ("org", ("headquarters", "country", "language"))]
_BAMBOO_SPECS = [("work", ("creator", "birth_year")), ("work", ("creator", "spouse")),
                 ("org", ("founded_by", "occupation")), ("person", ("spouse", "birthplace")),
                 ("org", ("founded_by", "birthplace")), ("person", ("member_of", "founded_year"))]
_COMPARE = {  # type -> (attribute, [(template, "min" = the earlier wins / "max" = the later wins)])
    "person": ("birth_year", [("Who was born first, {A} or {B}?", "min"), ("Who was born later, {A} or {B}?", "max")]),
    "org": ("founded_year", [("Which was founded first, {A} or {B}?", "min"),
                             ("Which organisation is older, {A} or {B}?", "min"),
                             ("Which was established more recently, {A} or {B}?", "max")]),
    "city": ("founded_year", [("Which city was founded first, {A} or {B}?", "min")]),
    "work": ("year", [("Which {kind} came out first, {A} or {B}?", "min"),
                      ("Which {kind} was {released} later, {A} or {B}?", "max")]),
}
_YESNO = {  # type -> (attribute, templates); works are only compared within one kind
    "person": ("nationality", ["Were {A} and {B} citizens of the same country?",
                               "Did {A} and {B} share the same nationality?"]),
    "city": ("country", ["Are {A} and {B} located in the same country?", "Are {A} and {B} in the same country?"]),
    "work": ("genre", ["Do {A} and {B} belong to the same genre?", "Are {A} and {B} {kind}s of the same genre?"]),
}


@dataclass
class _Draft:
    question: str
    answers: list[str]  # golden answers, aliases included
    chain: list[dict]  # gold_chain rows
    facts: list[tuple[str, str]]  # (subject id, relation) facts the question relies on
    anchors: list[str]  # entity ids the question names (or, for clue questions, asks for)
    tag: str = ""  # "yes"/"no"/"first"/"second": what the balancing counters track


class _QCtx:
    """State of generating one (split, family): its rng, the component's entities, balance counters."""

    def __init__(self, world: World, split: str, family: str):
        self.world, self.ents = world, world.entities
        self.rng = random.Random(derive_seed(world.config.seed, "questions", split, family))
        self.pool = {t: [e for e in world.entities.values() if e.type == t and e.split == split] for t in TYPES}
        self.tags: Counter = Counter()

    def entity(self, etype: str | None = None) -> Entity:
        if etype is None:
            etype = self.rng.choices(list(_TYPE_WEIGHTS), list(_TYPE_WEIGHTS.values()))[0]
        return self.rng.choice(self.pool[etype])


def _named(e: Entity, quote: bool = True, qualify: bool = True) -> str:
    """How a question names an entity: works quoted, namesakes with their disambiguator
    ("the composer Aldric Venn"), so a question never refers to two entities."""
    if quote and e.type == "work":
        return f"'{e.name}'"
    if qualify and e.info.get("disambig"):
        return f"the {e.info['disambig']} {e.name}"
    return e.name


def _giveaway(question: str, answer: str) -> bool:
    """Does the question contain its own answer (e.g. a disambiguator that is the answer)?"""
    norm = lambda t: " " + " ".join(re.sub(f"[{re.escape(string.punctuation)}]", "", t.lower()).split()) + " "  # noqa: E731
    return norm(answer) in norm(question)


def _work_slots(e: Entity) -> dict[str, str]:
    if e.type != "work":
        return {}
    spec = WORK_KINDS[e.info["kind"]]
    return {"kind": e.info["kind"], **{k: v for k, v in spec.items() if isinstance(v, str)}}


def _fill(template: str, x: str, subject: Entity) -> str:
    return template.format(X=x, Xc=x[0].upper() + x[1:], **_work_slots(subject))


def _hop(ctx: _QCtx, e: Entity, rel: str) -> dict:
    """One gold_chain row: a natural search query for the fact, its answer, the passages stating it."""
    # A namesake's occupation sub-query names it bare: its disambiguator is the answer.
    return {"sub_query": _fill(_NQ_Q[rel][0], _named(e, False, qualify=rel != "occupation"), e),
            "answer": answers(ctx.ents, rel, e.attrs[rel])[0],
            "passage_ids": sorted(ctx.world.fact_passages[(e.id, rel)], key=int)}


def _q_single(ctx: _QCtx, style: str) -> _Draft | None:
    e = ctx.entity()
    rel = ctx.rng.choice([r for r in ASKABLE[e.type] if e.attrs.get(r) is not None])
    if rel == "occupation" and e.info.get("disambig"):
        return None  # "the composer Aldric Venn" would give the answer away
    if style == "nq":  # NQ questions are lower-case search-log queries without quotes or "?"
        q = _fill(ctx.rng.choice(_NQ_Q[rel]), _named(e, False), e).lower()
    else:
        q = _fill(_POPQA_Q[rel], _named(e, False), e)
    return _Draft(q, answers(ctx.ents, rel, e.attrs[rel]), [_hop(ctx, e, rel)], [(e.id, rel)], [e.id])


def _q_chain(ctx: _QCtx, specs: list, hard: bool = False) -> _Draft | None:
    """A k-hop compositional question: follow relations from a named entity, describe each
    intermediate entity by its relation to the previous one, ask for the last fact."""
    start_type, rels = ctx.rng.choice(specs)
    cur = ctx.entity(start_type)
    steps = []
    for i, rel in enumerate(rels):
        if cur.attrs.get(rel) is None:
            return None
        steps.append((cur, rel))
        if i < len(rels) - 1:
            cur = ctx.ents[cur.attrs[rel]]
    # Prefer "the country where X was born" over a final-pair phrasing when both could apply.
    pair_before_last = len(rels) >= 3 and tuple(rels[-3:-1]) in _BRIDGE2
    use_final2 = tuple(rels[-2:]) in _FINAL2 and not pair_before_last and ctx.rng.random() < 0.6
    n_bridge = len(rels) - (2 if use_final2 else 1)
    phrase, i = _named(steps[0][0]), 0
    while i < n_bridge:  # describe each intermediate entity through the previous one
        e, rel = steps[i]
        pair = (rel, rels[i + 1]) if i + 1 < n_bridge else None
        if pair in _BRIDGE2 and ctx.rng.random() < 0.7:
            phrase, i = _fill(_BRIDGE2[pair], phrase, e), i + 2
        else:
            phrase, i = _fill((_HARD_BRIDGE if hard else _BRIDGE)[rel], phrase, e), i + 1
    last = rels[-1]
    if use_final2:
        templates = _FINAL2[tuple(rels[-2:])]
    else:
        templates = (_HARD_Q.get(last) if hard else None) or _MULTI_Q[last]
    q = _fill(ctx.rng.choice(templates), phrase, steps[-1][0])
    if cur.attrs[last] in {e.id for e, _ in steps}:
        return None  # degenerate loop, e.g. "the capital of the country where <the capital> is"
    if _giveaway(q, answers(ctx.ents, last, cur.attrs[last])[0]):
        return None
    return _Draft(q, answers(ctx.ents, last, cur.attrs[last]), [_hop(ctx, e, r) for e, r in steps],
                  [(e.id, r) for e, r in steps], [steps[0][0].id])


def _q_compare(ctx: _QCtx) -> _Draft | None:
    """"Which came first, A or B?"; the winner's position alternates so neither slot is a shortcut."""
    etype = ctx.rng.choice(list(_COMPARE))
    rel, templates = _COMPARE[etype]
    a, b = ctx.entity(etype), ctx.entity(etype)
    if a is b or a.attrs[rel] == b.attrs[rel] or (etype == "work" and a.info["kind"] != b.info["kind"]):
        return None
    if a.info.get("disambig") or b.info.get("disambig"):
        return None  # the answer is a bare name: keep comparisons to unambiguous names
    template, direction = ctx.rng.choice(templates)
    winner = min((a, b), key=lambda e: e.attrs[rel]) if direction == "min" else max((a, b), key=lambda e: e.attrs[rel])
    loser = b if winner is a else a
    slot = "first" if ctx.tags["first"] <= ctx.tags["second"] else "second"
    first, second = (winner, loser) if slot == "first" else (loser, winner)
    q = template.format(A=_named(first), B=_named(second), **_work_slots(a))
    return _Draft(q, aliases(winner), [_hop(ctx, first, rel), _hop(ctx, second, rel)],
                  [(first.id, rel), (second.id, rel)], [first.id, second.id], slot)


def _q_yesno(ctx: _QCtx) -> _Draft | None:
    """"Were A and B ... the same ...?", alternating the wanted answer so yes and no are balanced."""
    etype = ctx.rng.choice(list(_YESNO))
    rel, templates = _YESNO[etype]
    want = "yes" if ctx.tags["yes"] <= ctx.tags["no"] else "no"
    a = ctx.entity(etype)
    if a.info.get("disambig"):
        return None
    cands = [b for b in ctx.pool[etype] if b is not a and (b.attrs[rel] == a.attrs[rel]) == (want == "yes")
             and (etype != "work" or b.info["kind"] == a.info["kind"]) and not b.info.get("disambig")]
    if not cands:
        return None
    b = ctx.rng.choice(cands)
    if ctx.rng.random() < 0.5:
        a, b = b, a
    q = ctx.rng.choice(templates).format(A=_named(a), B=_named(b), **_work_slots(a))
    return _Draft(q, [want], [_hop(ctx, a, rel), _hop(ctx, b, rel)], [(a.id, rel), (b.id, rel)], [a.id, b.id], want)


_TRIVIA = {  # clue kind -> (entity type, clue relations, key relation, search clue, question phrasings)
    "born": ("person", ("occupation", "birthplace", "birth_year"), "birthplace",
             "{occupation} born in {birthplace} in {birth_year}",
             ["Which {occupation} was born in {birthplace} in {birth_year}?",
              "Name the {occupation} born in {birthplace} in {birth_year}.",
              "Who was the {occupation} born in {birth_year} in the city of {birthplace}?"]),
    "married": ("person", ("occupation", "nationality", "spouse"), "spouse", "{occupation} married to {spouse}",
                ["Which {occupation} from {nationality} was married to {spouse}?",
                 "Who was the {occupation} whose spouse was {spouse}?"]),
    "work": ("work", ("year", "genre", "creator"), "creator", "{year} {genre} {kind} by {creator}",
             ["Which {year} {genre} {kind} was {made_pp} by {creator}?", "{creator} {made} which {genre} {kind} in {year}?"]),
    "org": ("org", ("founded_year", "headquarters"), "headquarters", "{kind} founded in {founded_year} in {headquarters}",
            ["Which {kind}, founded in {founded_year}, is headquartered in {headquarters}?",
             "Name the {kind} established in {founded_year} with its headquarters in {headquarters}."]),
}


def _q_trivia(ctx: _QCtx) -> _Draft | None:
    """TriviaQA-like: the answer entity is described by clues that single it out world-wide."""
    etype, rels, key_rel, clue, phrasings = _TRIVIA[ctx.rng.choice(list(_TRIVIA))]
    e = ctx.entity(etype)
    if any(e.attrs.get(r) is None for r in rels):
        return None
    signature = tuple(e.attrs.get(r) for r in rels) + (e.info.get("kind"),)
    if ctx.world.clue_counts(e.type, rels)[signature] != 1:
        return None  # the clues must single out exactly one entity in the whole world
    values = slots(ctx.ents, e, ref=lambda x: _named(x, quote=False))
    # Gold passages: those stating every clue fact at once (the intro), else the key fact.
    sets = [set(ctx.world.fact_passages[(e.id, r)]) for r in rels]
    gold = set.intersection(*sets) or sets[rels.index(key_rel)]
    hop = {"sub_query": clue.format(**values), "answer": e.name, "passage_ids": sorted(gold, key=int)}
    return _Draft(ctx.rng.choice(phrasings).format(**values), aliases(e), [hop], [(e.id, r) for r in rels], [e.id])


_FAMILY_MAKERS: dict[str, list[tuple[float, Callable[[_QCtx], _Draft | None]]]] = {
    "syn_nq": [(1.0, lambda c: _q_single(c, "nq"))],
    "syn_triviaqa": [(1.0, _q_trivia)],
    "syn_popqa": [(1.0, lambda c: _q_single(c, "popqa"))],
    "syn_hotpotqa": [(0.7, lambda c: _q_chain(c, _HOTPOT_SPECS)), (0.3, _q_compare)],
    "syn_2wiki": [(0.35, _q_compare), (0.35, _q_yesno), (0.3, lambda c: _q_chain(c, _2WIKI_SPECS))],
    "syn_musique": [(1.0, lambda c: _q_chain(c, _MUSIQUE_SPECS))],
    "syn_bamboogle": [(1.0, lambda c: _q_chain(c, _BAMBOO_SPECS, hard=True))],
}


def train_counts(n: int, mix: dict[str, float]) -> dict[str, int]:
    """Integer counts summing to n in proportion to mix (largest remainder, ties in family order)."""
    total = sum(mix.values())
    raw = {f: n * mix[f] / total for f in FAMILIES}
    counts = {f: int(v) for f, v in raw.items()}
    for f in sorted(FAMILIES, key=lambda f: -(raw[f] - counts[f]))[: n - sum(counts.values())]:
        counts[f] += 1
    return counts


def make_split(world: World, split: str, counts: dict[str, int], seen: set[str]) -> list[dict]:
    """Rows of one split; ``seen`` (question texts of earlier splits) keeps texts unique world-wide."""
    drafts = []
    for family, n in counts.items():
        ctx = _QCtx(world, split, family)
        makers = _FAMILY_MAKERS[family]
        got, attempts = 0, 0
        while got < n:
            attempts += 1
            if attempts > 200 + 100 * n:
                raise ValueError(f"could only make {got} of {n} {family} questions for split {split!r}; "
                                 "raise the entity counts (n_people, n_works, ...) in WorldConfig")
            d = ctx.rng.choices([m for _, m in makers], [w for w, _ in makers])[0](ctx)
            if d is None or d.question in seen:
                continue
            seen.add(d.question)
            ctx.tags[d.tag] += 1
            drafts.append((family, d))
            got += 1
    random.Random(derive_seed(world.config.seed, "order", split)).shuffle(drafts)
    rows = []
    for index, (family, d) in enumerate(drafts):
        qid = f"{split}_{index}"
        world.question_meta[qid] = {"facts": d.facts, "anchors": d.anchors}
        rows.append({
            "id": qid, "question": d.question, "golden_answers": list(d.answers), "data_source": family,
            "prompt": [{"role": "user", "content": d.question}], "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": list(d.answers)}},
            "extra_info": {"split": split, "index": index, "question": d.question, "family": family,
                           "hops": len(d.chain), "gold_chain": d.chain},
        })
    return rows
