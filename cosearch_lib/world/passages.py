"""The corpus: entity articles cut into passages, near-duplicates, distractors and mentions.

Kinds of passage (``passage_meta[i]["kind"]``), each making a dense retriever good but imperfect:

* ``main``: one section of an entity's article, facts spread over sections and padded with
  neutral sentences up to ``min_passage_words``..``max_passage_words`` (dilution); a share
  ``indirect_rate`` of fact sentences is worded unlike the questions ("grew up in ..., the city
  of her birth" for "born in").
* ``paraphrase`` / ``ablated``: near-duplicates of a main passage, re-worded, or with one fact
  sentence swapped for a vague one ("Sources disagree about where X was born").
* ``distractor``: events, prizes, archives and disambiguation pages that name entities (or a
  confusable name) but state none of their facts.
* ``mention``: incoming mentions, the hard negatives real Wikipedia is full of. A page about an
  entity's associates ("Students of Aldric Venn", "Rivals of Heiba Studios") whose sentences
  state *other* entities' values of its relations, in the questions' words: "Mira Tol was born
  in Drask and later apprenticed with Aldric Venn." For "where was Aldric Venn born" it has the
  name and "born" but never the answer (any of the entity's answers, checked by ``has_answer``).

The strongest lever, though, is names (see entities.py): near-names and namesakes make the
passages of look-alike entities compete for every search, without adding passages.

``fact_passages`` records which passages state each fact; the questions' gold chains use it.
"""

from __future__ import annotations

import random

from cosearch_lib.config import WorldConfig
from cosearch_lib.metrics import has_answer
from cosearch_lib.seeding import derive_seed
from cosearch_lib.world.entities import ASKABLE, WORK_KINDS, Entity, answers
from cosearch_lib.world.families import TYPES
from cosearch_lib.world.text import (
    EVENT_KINDS,
    FACT_TEMPLATES,
    FILLERS,
    INDIRECT_TEMPLATES,
    MENTION_PAGES,
    MENTION_TEMPLATES,
    VAGUE,
    refs,
    sentence,
    slots,
)

SECTIONS = {"person": ("intro", "career", "life"), "work": ("intro", "production"), "org": ("intro", "history"),
            "city": ("intro", "history"), "country": ("intro", "culture")}


def _section_groups(e: Entity, section: str, works_by: dict[str, list[str]], rng: random.Random) -> list[str]:
    """Which fact groups a section of an entity's article states (facts are spread over sections)."""
    a = e.attrs
    if e.type == "person":
        if section == "intro":
            return rng.choice([["occupation+nationality", "birth_year+birthplace"],
                               ["occupation+nationality+birth_year", "birthplace"]])
        if section == "career":
            return (["member_of"] if a.get("member_of") else []) + [f"work:{w}" for w in works_by.get(e.id, [])[:2]]
        return ["spouse"] if a.get("spouse") else []
    return {("work", "intro"): ["year+genre"], ("work", "production"): ["creator"],
            ("org", "intro"): ["headquarters", "founded_year"], ("org", "history"): ["founded_by"],
            ("city", "intro"): ["country", "population"], ("city", "history"): ["founded_year"],
            ("country", "intro"): ["lead", "capital"], ("country", "culture"): ["language"]}[(e.type, section)]


def _group_facts(e: Entity, group: str) -> list[tuple[str, str]]:
    """The (subject id, relation) facts a sentence of this group states, symmetric ones included."""
    if group == "lead":
        return []
    if group.startswith("work:"):
        return [(group[5:], "creator")]
    facts = [(e.id, r) for r in group.split("+")]
    if group == "spouse":
        facts.append((e.attrs["spouse"], "spouse"))  # "A married B" also says whom B married
    if group == "capital":
        facts.append((e.attrs["capital"], "country"))  # "the capital of X is C" says C is in X
    return facts


def _pad(cfg: WorldConfig, sentences: list[str], fillers: list[str], rng: random.Random) -> str:
    """Insert neutral sentences (never before the first, which names the subject) up to a drawn
    length between min_passage_words and max_passage_words."""
    fillers = list(fillers)
    rng.shuffle(fillers)
    target = rng.randint(cfg.min_passage_words + 2, min(cfg.min_passage_words + 30, cfg.max_passage_words - 10))
    words = sum(len(s.split()) for s in sentences)
    for f in fillers:
        if words >= target:
            break
        if words + len(f.split()) > cfg.max_passage_words:
            break
        sentences.insert(rng.randint(1, len(sentences)), f)
        words += len(f.split())
    return " ".join(sentences)


def _realise(cfg: WorldConfig, ents: dict[str, Entity], works_by: dict[str, list[str]], e: Entity, section: str,
             variant: int, drop: bool = False) -> tuple[str, list[tuple[str, str]]] | None:
    """Text of one passage and the facts it states; variant > 0 re-draws phrasings (near-duplicates),
    ``drop`` blanks one fact sentence (a near-duplicate that lacks that fact). None if no facts."""
    rng = random.Random(derive_seed(cfg.seed, "passage", e.id, section, variant))
    groups = _section_groups(e, section, works_by, rng)
    if not groups:
        return None
    # drop: one fact sentence becomes a vague one (same subject, no askable value).
    gone = rng.choice([i for i, g in enumerate(groups) if g != "lead"]) if drop else -1
    base = slots(ents, e)
    sentences, facts = [], []
    for i, g in enumerate(groups):
        values = dict(base, **refs(e, i == 0, rng))
        if g.startswith("work:"):
            w = ents[g[5:]]
            values.update(title=w.name, kind=w.info["kind"], made=WORK_KINDS[w.info["kind"]]["made"])
        key = (e.type, "work" if g.startswith("work:") else g)
        if i == gone:
            sentences.append(sentence(VAGUE[key], values))
            continue
        indirect = INDIRECT_TEMPLATES.get(key) if rng.random() < cfg.indirect_rate else None
        sentences.append(sentence(rng.choice(indirect or FACT_TEMPLATES[key]), values))
        facts += _group_facts(e, g)
    fillers = [sentence(f, dict(base, **refs(e, False, rng))) for f in FILLERS[e.type]]
    return _pad(cfg, sentences, fillers, rng), facts


def _distractor(cfg: WorldConfig, ents: dict[str, Entity], by_type: dict[str, list[Entity]],
                pairs: list[tuple[str, str, str]], kind: str, rng: random.Random) -> tuple[str, str, list[str]] | None:
    """(title, text, mentioned entity ids) of a passage that names entities but states none of
    their askable facts; the years and cities it prints are chosen to differ from the real ones,
    so it looks relevant to a dense retriever yet does not contain the answer. ``pairs`` are the
    confusable names: (a id, b id, "near" or "namesake")."""
    cities = by_type["city"]
    year = rng.randint(1800, 2000)
    if kind == "event":
        city = rng.choice(cities)
        people = [p for p in rng.sample(by_type["person"], min(12, len(by_type["person"])))
                  if p.attrs["birthplace"] != city.id and p.attrs["birth_year"] != year][:3]
        if len(people) < 3:
            return None
        ek = rng.choice(EVENT_KINDS)
        title = f"{year} {city.name} {ek}"
        lead = [f"The {title} was a public gathering held in {city.name}.",
                f"Among those taking part were {people[0].name}, {people[1].name} and {people[2].name}."]
        mentioned = [city.id] + [p.id for p in people]
    elif kind == "adaptation":
        w = rng.choice(by_type["work"])
        if year == w.attrs["year"]:
            return None
        title = f"{w.name} (stage adaptation)"
        lead = [f"{w.name} was adapted for the stage in {year}, long after the original {w.info['kind']} first appeared.",
                f"The production opened in {rng.choice(cities).name} and toured for a season."]
        mentioned = [w.id]
    elif kind == "prize":
        p = rng.choice(by_type["person"])
        city = rng.choice(cities)
        if year == p.attrs["birth_year"] or city.id == p.attrs["birthplace"]:
            return None
        title = f"{p.info['surname']} Prize"
        lead = [f"The {title} is an award named in honour of {p.name}.",
                f"It was first presented in {city.name} in {year} and is given every few years."]
        mentioned = [p.id]
    elif kind == "archive":
        o = rng.choice(by_type["org"])
        city = rng.choice(cities)
        if year == o.attrs["founded_year"] or city.id == o.attrs["headquarters"]:
            return None
        title = f"{o.name} Archive"
        lead = [f"The {title} preserves papers and records relating to {o.name}.",
                f"The collection was moved to {city.name} in {year} and opened to researchers soon after."]
        mentioned = [o.id]
    else:  # "disambiguation": a confusable near-name pair, or two namesakes
        if not pairs:
            return None
        x, y, how = rng.choice(pairs)
        a, b = ents[x], ents[y]
        title = f"{a.name} (disambiguation)"
        if how == "namesake":
            lead = [f"{a.name} may refer to more than one person.",
                    f"Catalogues list at least two people of this name, {a.title} and {b.title}.",
                    "Readers should check dates and places carefully, since their records are easily mixed up."]
        else:
            noun = {"person": "person", "city": "place", "org": "organisation", "work": "work"}[a.type]
            lead = [f"{a.name} may refer to more than one subject.",
                    f"The name is often confused with {b.name}, a similar name that belongs to an unrelated {noun}.",
                    "Readers should check dates and places carefully, since the two names are easily mixed up in catalogues."]
        mentioned = [a.id, b.id]
    fillers = list(FILLERS["distractor"])
    rng.shuffle(fillers)
    text = lead
    while len(" ".join(text).split()) < cfg.min_passage_words + 5 and fillers:
        text = text + [fillers.pop()]
    return title, " ".join(text), mentioned


# ----------------------------------------------------------------------------- incoming mentions
def _partner(ents: dict[str, Entity], pool: list[Entity], t: Entity, rel: str, rng: random.Random) -> Entity | None:
    """Another entity of t's type and component whose value of ``rel`` differs from t's, so its
    sentence about ``rel`` naming t is a hard negative for t's fact (None if none found)."""
    want = set(answers(ents, rel, t.attrs[rel]))
    for _ in range(40):
        b = rng.choice(pool)
        if b is t or b.name == t.name or b.attrs.get(rel) is None:
            continue
        if t.type == "work" and b.info["kind"] != t.info["kind"] and rng.random() < 0.8:
            continue  # mostly the same kind, so the verbs match too ("written by")
        if want & set(answers(ents, rel, b.attrs[rel])):
            continue
        if rel == "spouse" and b.attrs["spouse"] == t.id:
            continue  # "B married T" would state t's answer
        return b
    return None


def _mention_page(cfg: WorldConfig, ents: dict[str, Entity], pool: list[Entity], t: Entity, rels: list[str],
                  page: int, rng: random.Random) -> dict | None:
    """One mention passage about target t: a title naming t, then one sentence per relation in
    ``rels``, each stating a partner's own (different) value in the words of that relation.
    A sentence is left out if the page would then contain any of t's answers (it must stay a
    negative for every question about t)."""
    title, lead = rng.choice(MENTION_PAGES[t.type])
    title, lead = title.format(T=t.name), lead.format(T=t.name)
    own = [answers(ents, r, t.attrs[r]) for r in ASKABLE[t.type] if t.attrs.get(r) is not None]
    kept: list[tuple[str, str, str]] = []  # (relation, partner id, sentence)
    for rel in rels:
        b = _partner(ents, pool, t, rel, rng)
        if b is None:
            continue
        s = sentence(rng.choice(MENTION_TEMPLATES[(t.type, rel)]), dict(slots(ents, b), **refs(b, True, rng), T=t.name))
        text = " ".join([title, lead, *(x for _, _, x in kept), s])
        if not any(has_answer(text, a) for a in own):
            kept.append((rel, b.id, s))
    if not kept:
        return None
    body = _pad(cfg, [lead, *(x for _, _, x in kept)], FILLERS["distractor"], rng)
    facts = [f for rel, b_id, _ in kept for f in _group_facts(ents[b_id], rel)]
    return {"title": title, "text": body, "entity": t.id, "kind": "mention", "section": f"mentions-{page}",
            "facts": facts, "mentions": [(t.id, rel) for rel, _, _ in kept]}


def _mention_records(cfg: WorldConfig, ents: dict[str, Entity]) -> list[dict]:
    """About ``mention_pages`` mention passages per entity, cycling through its relations so
    each fact gets its hard negatives."""
    pools: dict[tuple[str, str], list[Entity]] = {}
    for e in ents.values():
        pools.setdefault((e.type, e.split), []).append(e)
    whole, frac = int(cfg.mention_pages), cfg.mention_pages % 1
    recs = []
    for t in ents.values():
        rng = random.Random(derive_seed(cfg.seed, "mentions", t.id))
        rels = [r for r in ASKABLE[t.type] if t.attrs.get(r) is not None]
        rng.shuffle(rels)
        n_pages = whole + (rng.random() < frac)
        k = min(cfg.mention_sentences, len(rels))
        for page in range(n_pages):
            chosen = [rels[(page * k + i) % len(rels)] for i in range(k)]
            rec = _mention_page(cfg, ents, pools[(t.type, t.split)], t, chosen, page, rng)
            if rec:
                recs.append(rec)
    return recs


# ----------------------------------------------------------------------------- the corpus
def _main_records(cfg: WorldConfig, ents: dict[str, Entity], works_by: dict[str, list[str]]) -> list[dict]:
    recs = []
    for e in ents.values():
        for section in SECTIONS[e.type]:
            out = _realise(cfg, ents, works_by, e, section, 0)
            if out:
                recs.append({"title": e.title, "text": out[0], "entity": e.id, "kind": "main", "section": section,
                             "facts": out[1]})
    return recs


def _near_duplicates(cfg: WorldConfig, ents: dict[str, Entity], works_by: dict[str, list[str]], main: list[dict],
                     rng: random.Random) -> list[dict]:
    recs = []
    for j, i in enumerate(rng.sample(range(len(main)), round(cfg.near_duplicate_rate * len(main)))):
        m, e = main[i], ents[main[i]["entity"]]
        # Mostly fact-less copies: they look as relevant as the gold passage to a dense retriever.
        out = _realise(cfg, ents, works_by, e, m["section"], 1, drop=True) if j % 3 else None
        kind = "ablated" if out else "paraphrase"
        for variant in range(2, 8):  # re-draw until the paraphrase really differs in wording
            if out and out[0] != m["text"]:
                break
            out = _realise(cfg, ents, works_by, e, m["section"], variant)
        recs.append({"title": e.title, "text": out[0], "entity": e.id, "kind": kind, "section": m["section"],
                     "facts": out[1]})
    return recs


def _distractors(cfg: WorldConfig, ents: dict[str, Entity], pairs: list[tuple[str, str, str]], n_main: int,
                 rng: random.Random) -> list[dict]:
    recs = []
    by_type = {t: [e for e in ents.values() if e.type == t] for t in TYPES}
    kinds = ["event", "adaptation", "prize", "archive", "disambiguation"]
    n_dis, tries = round(cfg.distractor_rate * n_main), 0
    while n_dis > 0 and tries < 50 * n_main:
        tries += 1
        out = _distractor(cfg, ents, by_type, pairs, kinds[tries % len(kinds)], rng)
        if out:
            recs.append({"title": out[0], "text": out[1], "entity": ",".join(out[2]), "kind": "distractor",
                         "section": kinds[tries % len(kinds)], "facts": []})
            n_dis -= 1
    return recs


def build_passages(cfg: WorldConfig, ents: dict[str, Entity], near: list[tuple[str, str]],
                   namesakes: list[tuple[str, str]]) -> tuple[list[dict], list[dict], dict[tuple[str, str], list[str]]]:
    """Corpus rows, their metadata (entity, kind, section, stated facts, mentions) and fact -> passage ids."""
    rng = random.Random(derive_seed(cfg.seed, "corpus"))
    works_by: dict[str, list[str]] = {}
    for e in ents.values():
        if e.type == "work":
            works_by.setdefault(e.attrs["creator"], []).append(e.id)
    main = _main_records(cfg, ents, works_by)
    pairs = [(a, b, "near") for a, b in near] + [(a, b, "namesake") for a, b in namesakes]
    recs = (main + _near_duplicates(cfg, ents, works_by, main, rng) + _distractors(cfg, ents, pairs, len(main), rng)
            + _mention_records(cfg, ents))
    rng.shuffle(recs)  # ids carry no structure (an id-adjacency shortcut would be a leak)
    passages, meta, fact_passages = [], [], {}
    for pid, r in enumerate(recs):
        passages.append({"id": str(pid), "contents": f'"{r["title"]}"\n{r["text"]}'})
        meta.append({"id": str(pid), **{k: r[k] for k in ("entity", "kind", "section")},
                     "facts": [list(f) for f in r["facts"]], "mentions": [list(m) for m in r.get("mentions", [])]})
        for f in r["facts"]:
            fact_passages.setdefault(tuple(f), []).append(str(pid))
    return passages, meta, fact_passages
