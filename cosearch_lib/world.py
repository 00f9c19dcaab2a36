"""The embedded world: a seeded, fictional encyclopedia plus QA in the Search-R1 row schema.

Why fictional: every name and fact is made up, so no language model can answer from memory and
retrieval is required, exactly the setting CoSearch studies. The world is the project's default
data set: ``corpus.jsonl`` in the wiki-18 row format (``{"id", "contents"}``, contents = quoted
title line + text) and ``train/dev/test.parquet`` in the Search-R1 schema, so the same code reads
it and the real benchmarks.

How it is built (each step keeps the next honest):
1. Entities (people, works, organisations, cities, countries) with syllable-made names and
   attributes/relations (birthplace, founder, author, ...) so multi-hop chains exist. Some people
   and cities get confusable near-names ("Aldric Venn" / "Aldric Vennor") as natural distractors.
2. Every entity belongs to one *component* (train, dev or test) and relations never cross
   components. A question of split s only uses facts of component s, so no (subject, relation)
   fact, anchor entity or question text is shared across splits: no leakage by construction.
3. Passages (40-120 words, several per entity, facts spread across them, several phrasings per
   fact) plus near-duplicates (paraphrases, and copies with one fact removed) and distractors
   (mention an entity, or a confusable name, but none of its facts), so a dense retriever is
   good but imperfect. ``fact_passages`` records which passages state each fact; the questions'
   ``gold_chain`` is built from it.
4. Seven question families mirroring the paper's seven benchmarks (``FAMILIES``).

Only ``random.Random`` instances seeded through :func:`cosearch_lib.seeding.derive_seed` are
used (never global RNG state), so one config always gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .seeding import derive_seed

#: Bump when the generator's output changes, so cached worlds built by older code are rebuilt.
GENERATOR_VERSION = 1
SPLITS = ("train", "dev", "test")
_TYPES = ("country", "city", "person", "org", "work")


# ----------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    name: str  # the ``data_source`` value of its rows
    group: str  # "single" or "multi" (the paper's grouped averages)
    mirrors: str  # ``data_source`` of the real benchmark it imitates
    description: str  # one line: what its questions look like


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("syn_nq", "single", "nq", "one fact about a named entity, lower-case search-log style like NQ"),
    Family("syn_triviaqa", "single", "triviaqa", "the answer entity is described by clues instead of named"),
    Family("syn_popqa", "single", "popqa", "one fixed template per relation, PopQA style"),
    Family("syn_hotpotqa", "multi", "hotpotqa", "2-hop bridge questions plus some which-came-first comparisons"),
    Family("syn_2wiki", "multi", "2wikimultihopqa", "comparisons, balanced yes/no questions and 2-hop compositions"),
    Family("syn_musique", "multi", "musique", "3-hop compositional chains"),
    Family("syn_bamboogle", "multi", "bamboogle", "2-hop compositions with indirect, fronted phrasing"),
]}


def _default_mix() -> dict[str, float]:
    # Paper's training set: NQ 40%, HotpotQA 28%, MuSiQue 18%, 2Wiki 15%; we also train on the
    # other families a little so every data_source has in-distribution training examples.
    return {"syn_nq": 0.28, "syn_triviaqa": 0.08, "syn_popqa": 0.08, "syn_hotpotqa": 0.24,
            "syn_2wiki": 0.12, "syn_musique": 0.14, "syn_bamboogle": 0.06}


# ----------------------------------------------------------------------------- config
@dataclass
class WorldConfig:
    seed: int = 0  # master seed: the same config always gives byte-identical files
    n_people: int = 640  # people (novelists, film directors, composers, scientists, ...)
    n_works: int = 520  # novels, films and albums, each made by one person
    n_orgs: int = 160  # organisations (publishers, studios, universities, ...)
    n_cities: int = 140  # cities, each in one country
    n_countries: int = 16  # countries, each with a capital and an official language
    n_train_questions: int = 2000  # training questions, families mixed by train_mix
    n_dev_per_family: int = 50  # dev questions per family
    n_test_per_family: int = 100  # test questions per family
    split_fractions: tuple[float, float, float] = (0.6, 0.15, 0.25)  # share of entities in the train/dev/test components
    near_duplicate_rate: float = 0.20  # near-duplicate passages per main passage (1/3 paraphrases, 2/3 missing one fact)
    distractor_rate: float = 0.15  # distractor passages per main passage (mention entities, state none of their facts)
    near_name_rate: float = 0.25  # share of people and cities named after a confusable earlier name
    spouse_rate: float = 0.5  # share of people married to another person of their component
    member_rate: float = 0.8  # share of people who work for an organisation
    min_passage_words: int = 40  # passages are padded with neutral sentences up to at least this many words
    max_passage_words: int = 120  # and never exceed this many words
    train_mix: dict[str, float] = field(default_factory=_default_mix)  # family -> share of the training questions

    def __post_init__(self) -> None:
        self.split_fractions = tuple(float(x) for x in self.split_fractions)  # YAML gives a list
        for name in ("n_people", "n_works", "n_orgs", "n_cities", "n_countries"):
            if getattr(self, name) < 6:
                raise ValueError(f"WorldConfig.{name} must be >= 6 (two per component), got {getattr(self, name)}")
        if len(self.split_fractions) != 3 or min(self.split_fractions) <= 0:
            raise ValueError(f"WorldConfig.split_fractions must be three positive shares, got {self.split_fractions}")
        for name in ("near_duplicate_rate", "distractor_rate", "near_name_rate", "spouse_rate", "member_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorldConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if set(self.train_mix) != set(FAMILIES) or min(self.train_mix.values()) < 0:
            raise ValueError(f"WorldConfig.train_mix needs a share >= 0 for each of {sorted(FAMILIES)}, "
                             f"got {self.train_mix}")
        if not 20 <= self.min_passage_words < self.max_passage_words - 30:
            raise ValueError("WorldConfig needs 20 <= min_passage_words < max_passage_words - 30, got "
                             f"{self.min_passage_words}, {self.max_passage_words}")

    @classmethod
    def tiny(cls, seed: int = 0) -> "WorldConfig":
        """A world of ~300 passages for CI and quick demos (generates in a fraction of a second)."""
        return cls(seed=seed, n_people=50, n_works=40, n_orgs=14, n_cities=14, n_countries=8,
                   n_train_questions=100, n_dev_per_family=5, n_test_per_family=10)


def world_fingerprint(cfg: WorldConfig) -> str:
    """Stable hash of the config and generator version: the cache key of a written world."""
    blob = json.dumps({"config": asdict(cfg), "generator_version": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- entities
@dataclass
class Entity:
    id: str  # "<type>:<n>", e.g. "person:12"
    type: str  # country, city, person, org or work
    name: str  # display name (a work's title)
    split: str  # component: train, dev or test
    attrs: dict = field(default_factory=dict)  # relation -> literal (int/str) or entity id; these are the askable facts
    info: dict = field(default_factory=dict)  # descriptive, never asked: gender, kind, surname, formal name


_REF_RELATIONS = {"birthplace", "nationality", "spouse", "member_of", "founded_by", "headquarters",
                  "country", "capital", "creator"}
_OCCUPATIONS = {"novelist": 16, "poet": 6, "historian": 5, "film director": 12, "composer": 8, "singer": 6,
                "painter": 8, "architect": 7, "chemist": 6, "astronomer": 5, "politician": 8, "engineer": 7,
                "cartographer": 3, "sculptor": 3}
_OCC_ALIASES = {"film director": ["director"]}
_WORK_KINDS = {  # kind -> verbs and nouns used in text and questions, and who can make one
    "novel": dict(made="wrote", made_pp="written", role="author", released="published",
                  creators=("novelist", "poet", "historian"),
                  genres=("mystery", "historical", "fantasy", "satirical", "gothic", "adventure")),
    "film": dict(made="directed", made_pp="directed", role="director", released="released",
                 creators=("film director",), genres=("drama", "comedy", "thriller", "documentary", "western")),
    "album": dict(made="recorded", made_pp="recorded", role="performer", released="released",
                  creators=("composer", "singer"), genres=("folk", "jazz", "choral", "ballad", "orchestral")),
}
_ORG_KINDS = [  # (kind, short noun for later mentions, name suffixes)
    ("publishing house", "press", ["Press", "Books"]), ("film studio", "studio", ["Pictures", "Studios"]),
    ("record label", "label", ["Records"]), ("university", "university", ["University", "College"]),
    ("shipping company", "company", ["Shipping Company", "Lines"]), ("bank", "bank", ["Bank"]),
    ("observatory", "observatory", ["Observatory"]), ("museum", "museum", ["Museum"]),
    ("orchestra", "orchestra", ["Philharmonic", "Orchestra"]), ("trading company", "company", ["Trading Company"]),
]
_FORMAL = ["Republic of", "Kingdom of", "Federation of", "Grand Duchy of", "Commonwealth of"]
_TITLE_ADJ = ("Glass Silent Hollow Crimson Distant Paper Iron Quiet Amber Broken Northern Burning Gentle "
              "Patient Silver Restless Forgotten Velvet Copper Seventh Narrow Wandering Painted Borrowed "
              "Sleeping Drowned Hidden Bright Last Lonely Salt Winter").split()
_TITLE_NOUN = ("Orchard Lantern Harbour Cartographer Mirror Garden River Tower Letter Island Bell Compass "
               "Archive Meadow Furnace Lighthouse Ferry Clockmaker Weaver Violin Shore Forest Bridge Window "
               "Kingdom Ember Thread Anchor Orchid Falcon Atlas Cellar Quarry Tide Season Harvest Voyage "
               "Signal Chorus Lake").split()

_ONSETS = "b br c d dr f g gr h k kr l m n p r s st t th tr v w z j sh".split() + ["", ""]
_VOWELS = "a e i o u a e i o a e o y ae ei ou".split()
_CODAS = "n r l s th nd rk m v ll rn".split() + ["", "", ""]
_BAD_CLUSTER = re.compile(r"(.)\1\1|[aeiou]{3}|[^aeiou]{4}|^[^aeiou]{3}")


def _a(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _a_year(year: int) -> str:
    """Indefinite article for a year: "an 1843 novel" (eighteen...) but "a 1921 novel"."""
    return ("an " if str(year).startswith(("8", "11", "18")) else "a ") + str(year)


class _Namer:
    """Pronounceable made-up words, unique world-wide (case-insensitive) and never a word the
    templates use, so a name cannot match unrelated text in answer-containment checks."""

    def __init__(self, rng: random.Random, blocked: set[str]):
        self.rng, self.used = rng, set(blocked)

    def claim(self, word: str) -> bool:
        if word.lower() in self.used:
            return False
        self.used.add(word.lower())
        return True

    def fresh(self, syllables: tuple[int, ...] = (2,), suffixes: tuple[str, ...] = ("",), max_len: int = 10) -> str:
        r = self.rng
        for _ in range(100_000):
            n = r.choice(syllables)
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) + (r.choice(_CODAS) if i == n - 1 or r.random() < 0.3 else "")
                        for i in range(n)) + r.choice(suffixes)
            if 5 <= len(w) <= max_len and not _BAD_CLUSTER.search(w) and self.claim(w):
                return w.capitalize()
        raise RuntimeError("name space exhausted; lower the entity counts")

    def near(self, word: str) -> str | None:
        """A confusable variant of ``word`` (extra ending or one vowel changed), if still free."""
        opts = [word + s for s in ("or", "a", "en", "e", "s")]
        for i, ch in enumerate(word):
            if ch in "aeiou":
                opts += [word[:i] + v + word[i + 1:] for v in "aeiou" if v != ch]
                break
        self.rng.shuffle(opts)
        return next((o for o in opts if self.claim(o)), None)


def _components(what: str, n: int, fractions: tuple[float, float, float], minimum: dict[str, int],
                rng: random.Random) -> list[str]:
    """Split labels for n entities: test and dev get their share (at least ``minimum``), train the rest."""
    total = sum(fractions)
    k = {s: max(minimum[s], int(n * f / total + 0.5)) for s, f in zip(SPLITS, fractions) if s != "train"}
    k["train"] = n - k["dev"] - k["test"]
    if k["train"] < minimum["train"]:
        raise ValueError(f"WorldConfig.{what}={n} cannot give each split its minimum {minimum}; raise it")
    labels = [s for s in SPLITS for _ in range(k[s])]
    rng.shuffle(labels)
    return labels


def _build_entities(cfg: WorldConfig, blocked: set[str]) -> tuple[dict[str, Entity], list[tuple[str, str]]]:
    """All entities, their facts and the near-name pairs; every relation stays inside a component."""
    rng = random.Random(derive_seed(cfg.seed, "entities"))
    namer = _Namer(random.Random(derive_seed(cfg.seed, "names")), blocked)
    ents: dict[str, Entity] = {}
    near: list[tuple[str, str]] = []
    by = {(t, s): [] for t in _TYPES for s in SPLITS}  # (type, split) -> entities

    def add(e: Entity) -> Entity:
        ents[e.id] = e
        by[(e.type, e.split)].append(e)
        return e

    two = dict.fromkeys(SPLITS, 2)
    for i, split in enumerate(_components("n_countries", cfg.n_countries, cfg.split_fractions, two, rng)):
        name = namer.fresh((1, 2), ("ia", "ara", "ova", "enne", "oria", "and"))
        lang = namer.fresh((1, 2), ("ish", "ic", "ese", "i"))
        add(Entity(f"country:{i}", "country", name, split, {"language": lang},
                   {"formal": f"{rng.choice(_FORMAL)} {name}"}))
    # Every country needs a city (its capital), so a component gets at least as many cities.
    need = {s: max(2, len(by[("country", s)])) for s in SPLITS}
    city_suffix = ("mar", "holt", "ford", "wick", "stad", "by", "mere", "dale", "port", "haven", "ton", "burg", "")
    for i, split in enumerate(_components("n_cities", cfg.n_cities, cfg.split_fractions, need, rng)):
        earlier = [e for e in ents.values() if e.type == "city"]
        name = None
        if earlier and rng.random() < cfg.near_name_rate:
            base = rng.choice(earlier)
            name = namer.near(base.name)
        city = add(Entity(f"city:{i}", "city", name or namer.fresh((1, 2), city_suffix), split,
                          {"population": rng.randint(2, 900) * 1000 + rng.randint(0, 9) * 100,
                           "founded_year": rng.randint(850, 1750)}))
        if name:
            near.append((base.id, city.id))
    for split in SPLITS:
        countries, cities = by[("country", split)], by[("city", split)]
        for j, city in enumerate(cities):  # round-robin first, so each country has a city
            city.attrs["country"] = countries[j].id if j < len(countries) else rng.choice(countries).id
        for c in countries:
            c.attrs["capital"] = rng.choice([x for x in cities if x.attrs["country"] == c.id]).id

    # A small pool of given names: many people share one, as in real encyclopedias.
    given_sfx = ("", "", "a", "in", "el", "ric", "wen")
    givens = [namer.fresh((1, 2), given_sfx, max_len=8) for _ in range(max(30, cfg.n_people // 8))]
    occ_names, occ_weights = list(_OCCUPATIONS), list(_OCCUPATIONS.values())
    clustered: list[Entity] = []  # people in a near-name pair
    for i, split in enumerate(_components("n_people", cfg.n_people, cfg.split_fractions, dict.fromkeys(SPLITS, 4), rng)):
        earlier = [e for s in SPLITS for e in by[("person", s)]]
        given, surname, base = rng.choice(givens), None, None
        if earlier and rng.random() < cfg.near_name_rate:
            # Often extend an existing cluster ("Venn", "Vennor", "Venna"): several look-alike
            # people compete for one name, which is what makes exact-name retrieval imperfect.
            base = rng.choice(clustered if clustered and rng.random() < 0.6 else earlier)
            given, surname = base.info["given"], namer.near(base.info["surname"])
            base = base if surname else None
        surname = surname or namer.fresh((1, 2), ("", "", "en", "ard", "ley", "mont", "wick", "er", "ov"))
        forced = ["novelist", "film director", "composer"]  # each component can make every kind of work
        k = len(by[("person", split)])
        occ = forced[k] if k < 3 else rng.choices(occ_names, occ_weights)[0]
        city = rng.choice(by[("city", split)])
        home = ents[city.attrs["country"]]
        others = [c for c in by[("country", split)] if c is not home]
        p = add(Entity(f"person:{i}", "person", f"{given} {surname}", split,
                       {"occupation": occ, "birth_year": rng.randint(1780, 1960), "birthplace": city.id,
                        "nationality": (home if rng.random() < 0.7 else rng.choice(others)).id},
                       {"given": given, "surname": surname, "gender": rng.choice("mf")}))
        if base:
            near.append((base.id, p.id))
            clustered += [base, p]

    for i, split in enumerate(_components("n_orgs", cfg.n_orgs, cfg.split_fractions, two, rng)):
        kind, short, suffixes = rng.choice(_ORG_KINDS)
        people = by[("person", split)]
        taken = {o.attrs["founded_by"] for o in by[("org", split)]}
        founder = rng.choice([p for p in people if p.id not in taken] or people)
        add(Entity(f"org:{i}", "org", f"{namer.fresh((1, 2))} {rng.choice(suffixes)}", split,
                   {"founded_year": founder.attrs["birth_year"] + rng.randint(25, 60), "founded_by": founder.id,
                    "headquarters": rng.choice(by[("city", split)]).id},
                   {"kind": kind, "short": short}))
    for split in SPLITS:
        people = list(by[("person", split)])
        for p in people:
            if rng.random() < cfg.member_rate:
                p.attrs["member_of"] = rng.choice(by[("org", split)]).id
        rng.shuffle(people)
        n_married = int(len(people) * cfg.spouse_rate) // 2 * 2
        for a, b in zip(people[0:n_married:2], people[1:n_married:2]):
            a.attrs["spouse"], b.attrs["spouse"] = b.id, a.id

    titles: set[str] = set()
    for i, split in enumerate(_components("n_works", cfg.n_works, cfg.split_fractions, two, rng)):
        kind = rng.choice(list(_WORK_KINDS))
        spec = _WORK_KINDS[kind]
        maker = rng.choice([p for p in by[("person", split)] if p.attrs["occupation"] in spec["creators"]])
        add(Entity(f"work:{i}", "work", _title(rng, namer, titles), split,
                   {"year": maker.attrs["birth_year"] + rng.randint(22, 60), "genre": rng.choice(spec["genres"]),
                    "creator": maker.id}, {"kind": kind}))
    return ents, near


def _title(rng: random.Random, namer: _Namer, used: set[str]) -> str:
    """A made-up work title from English words (or one invented place), unique in the world."""
    for _ in range(10_000):
        adj, noun, noun2 = rng.choice(_TITLE_ADJ), rng.choice(_TITLE_NOUN), rng.choice(_TITLE_NOUN)
        pattern = rng.randrange(5)
        if pattern == 2:
            t = f"The {noun} of {namer.fresh((2,))}"
        else:
            article = "An" if noun[0] in "AEIOU" else "A"
            t = [f"The {adj} {noun}", f"{adj} {noun}", "", f"{noun} and {noun2}",
                 f"{article} {noun} for the {adj} {noun2}"][pattern]
        if noun != noun2 and t.lower() not in used:
            used.add(t.lower())
            return t
    raise RuntimeError("title space exhausted; lower n_works")


# ----------------------------------------------------------------------------- passages
# Phrasings per fact group. {S}/{s}: the subject, sentence-initial / inside (full name the first
# time in a passage, later a pronoun, surname or "the novel"); {Pos}/{pos}: its possessive;
# {he}/{his}: always a pronoun (only where the name already appeared in the sentence).
_FACT_TEMPLATES: dict[tuple[str, str], list[str]] = {
    ("person", "occupation+nationality"): [
        "{S} was {a_occupation} from {nationality}.",
        "{S} was {a_occupation} who held the citizenship of {nationality}.",
        "A citizen of {nationality}, {s} worked as {a_occupation} for most of {his} life."],
    ("person", "birth_year+birthplace"): [
        "{S} was born in {birthplace} in {birth_year}.",
        "{S} was born in {birth_year} in the city of {birthplace}.",
        "Records show that {s} was born in {birthplace} in the year {birth_year}."],
    ("person", "occupation+nationality+birth_year"): [
        "{S} (born {birth_year}) was {a_occupation} from {nationality}.",
        "{S}, born in {birth_year}, was {a_occupation} and a citizen of {nationality}."],
    ("person", "birthplace"): [
        "{S} was born in the city of {birthplace}.",
        "{Pos} birthplace was {birthplace}.",
        "{S} was a native of {birthplace}, where {he} was born."],
    ("person", "member_of"): [
        "{S} later joined {member_of}.",
        "For many years {s} worked for {member_of}.",
        "{S} was a long-standing member of {member_of}."],
    ("person", "work"): [
        "{S} {made} the {kind} {title}.",
        "Among {pos} works is the {kind} {title}.",
        "One of the best-known works of {s} is the {kind} {title}."],
    ("person", "spouse"): [
        "{S} married {spouse}.",
        "{S} was married to {spouse}.",
        "{Pos} spouse was {spouse}."],
    ("work", "year+genre"): [
        "{S} is {a_year} {genre} {kind}.",
        "{S} is a {genre} {kind} first {released} in {year}.",
        "First {released} in {year}, {s} is {a_genre} {kind}."],
    ("work", "creator"): [
        "{S} was {made_pp} by {creator}.",
        "{creator} {made} {s}.",
        "{Pos} {role} was {creator}."],
    ("org", "headquarters"): [
        "{S} is {a_kind} headquartered in {headquarters}.",
        "{S} is {a_kind} based in {headquarters}.",
        "{S}, {a_kind}, has its headquarters in {headquarters}."],
    ("org", "founded_year"): [
        "{S} was founded in {founded_year}.",
        "{S} was established in {founded_year}.",
        "{Pos} history begins in {founded_year}, the year it was founded."],
    ("org", "founded_by"): [
        "{S} was founded by {founded_by}.",
        "{founded_by} founded {s}.",
        "{Pos} founder was {founded_by}."],
    ("city", "country"): [
        "{S} is a city in {country}.",
        "{S} is a city located in {country}.",
        "{S} is one of the cities of {country}."],
    ("city", "population"): [
        "{S} has a population of {population}.",
        "{Pos} population is {population}.",
        "About {population} people live in {s}."],
    ("city", "founded_year"): [
        "{S} was founded in {founded_year}.",
        "{S} received its town charter in {founded_year}.",
        "{Pos} founding is dated to {founded_year}."],
    ("country", "lead"): [
        "{S}, officially the {formal}, is a sovereign state.",
        "{S} (officially the {formal}) is a country."],
    ("country", "capital"): [
        "The capital of {s} is {capital}.",
        "{S} is governed from its capital, {capital}.",
        "{Pos} capital and seat of government is {capital}."],
    ("country", "language"): [
        "The official language of {s} is {language}.",
        "{S} has {language} as its official language.",
        "Most people in {s} speak {language}, the official language."],
}
# Near-duplicates "with the key fact missing" swap one fact sentence for one of these: it still
# names the subject (so it looks relevant) but states nothing askable.
_VAGUE: dict[tuple[str, str], str] = {
    ("person", "occupation+nationality"): "{S} is remembered mainly through the accounts of others.",
    ("person", "birth_year+birthplace"): "Sources disagree about the date and place of {pos} birth.",
    ("person", "occupation+nationality+birth_year"): "{S} is a figure about whom surprisingly little is certain.",
    ("person", "birthplace"): "Sources disagree about where {s} was born.",
    ("person", "member_of"): "{S} was associated with several institutions over the years.",
    ("person", "work"): "{S} produced a number of works that are now hard to find.",
    ("person", "spouse"): "{Pos} private life is only sparsely documented.",
    ("work", "year+genre"): "{S} is {a_kind_w} whose first appearance is poorly documented.",
    ("work", "creator"): "The origins of {s} have occasionally been discussed by critics.",
    ("org", "headquarters"): "{S} is {a_kind} that has moved its offices more than once.",
    ("org", "founded_year"): "The exact founding date of {s} is uncertain.",
    ("org", "founded_by"): "Accounts of who established {s} differ.",
    ("city", "country"): "{S} is a city with a long regional history.",
    ("city", "population"): "The population of {s} has changed considerably over time.",
    ("city", "founded_year"): "The origins of {s} are obscure.",
    ("country", "capital"): "{S} has a centralised system of government.",
    ("country", "language"): "Several languages are spoken in {s}.",
}
# Neutral sentences that pad passages to a realistic length and state no fact.
_FILLERS: dict[str, list[str]] = {
    "person": [
        "{S} was known among colleagues for a patient and meticulous working method.",
        "{S} rarely gave interviews and left behind only a small collection of letters.",
        "{Pos} early years are poorly documented, and several accounts of them conflict.",
        "Contemporary critics described {pos} approach as careful, restrained and deliberate.",
        "{S} travelled widely and kept detailed notebooks on each journey.",
        "{Pos} correspondence with friends survives in several private collections.",
        "Later biographers argued that {pos} influence had long been underestimated.",
        "{S} took on a number of students, some of whom became well known in their own right.",
        "{S} spent long periods working in near isolation.",
        "{Pos} reputation grew slowly, mostly through word of mouth.",
        "A small memorial plaque marks one of the houses where {s} lived.",
        "{S} was noted for a dry sense of humour and a dislike of ceremony."],
    "work": [
        "{S} received mixed reviews when it first appeared.",
        "Critics later praised {pos} careful structure and restrained tone.",
        "{S} has been reissued several times.",
        "{Pos} reception improved considerably in later decades.",
        "Several scholars have written about {pos} recurring themes of memory and loss.",
        "{S} was translated into a number of languages.",
        "Younger artists often cite {s} as an early influence.",
        "{S} sold modestly at first but gained a devoted following.",
        "Some early copies of {s} differ slightly from the standard edition.",
        "{S} is frequently included in lists of overlooked classics.",
        "{Pos} opening section is often quoted."],
    "org": [
        "{S} grew steadily during its first decades.",
        "{Pos} archives are open to researchers by appointment.",
        "{S} has gone through several reorganisations.",
        "{S} is governed by a board of trustees.",
        "Over time, {s} expanded its activities well beyond its original purpose.",
        "{S} has been the subject of several institutional histories.",
        "{Pos} main building was renovated after a fire.",
        "{S} maintains a small public collection.",
        "Former employees of {s} include several notable figures.",
        "{S} publishes a short annual report on its activities."],
    "city": [
        "{S} is known for its narrow streets and old market square.",
        "{Pos} economy has traditionally relied on trade and crafts.",
        "{S} hosts a weekly market that draws visitors from the surrounding region.",
        "Several bridges cross the river that runs through {s}.",
        "{Pos} old town contains a number of well-preserved buildings.",
        "{S} has a mild climate with wet winters.",
        "{S} grew rapidly after the arrival of the railway.",
        "A number of small museums are located in {s}.",
        "{S} is surrounded by farmland and low wooded hills.",
        "{Pos} central square is lined with cafes and civic buildings."],
    "country": [
        "{S} has a varied landscape of hills, rivers and coastal plains.",
        "{Pos} economy is based largely on agriculture, trade and fishing.",
        "{S} is divided into several provinces.",
        "{S} has a long tradition of folk music and storytelling.",
        "{S} is known for its mountain villages and terraced fields.",
        "{Pos} national holiday is celebrated each spring.",
        "{S} maintains a small standing army and a coast guard.",
        "Rail lines connect the main towns of {s}.",
        "{Pos} parliament meets in a restored palace."],
    "distractor": [
        "The occasion attracted visitors from several neighbouring regions.",
        "Local newspapers covered it in some detail at the time.",
        "Organisers described it as a modest but lively affair.",
        "Contemporary accounts differ on several details.",
        "A short printed programme survives in a regional library.",
        "Few photographs of it are known to exist.",
        "It is mentioned only briefly in most reference works.",
        "Later commentators have questioned how much influence it really had."],
}
_EVENT_KINDS = ["Festival", "Book Fair", "Congress", "Exhibition", "Regatta", "Music Week"]


def _template_words() -> set[str]:
    """Every word the templates can print: generated names must avoid them (see _Namer)."""
    texts = [t for ts in _FACT_TEMPLATES.values() for t in ts] + [t for ts in _FILLERS.values() for t in ts]
    texts += list(_VAGUE.values())
    texts += [w for kind in _WORK_KINDS.values() for v in kind.values() for w in ([v] if isinstance(v, str) else v)]
    texts += list(_OCCUPATIONS) + [k for k, _, sfx in _ORG_KINDS for k in [k, *sfx]] + _FORMAL + _EVENT_KINDS
    texts += _TITLE_ADJ + _TITLE_NOUN
    return {w for t in texts for w in re.findall(r"[a-z]+", re.sub(r"\{[^}]*\}", " ", t).lower())}


def _slots(ents: dict[str, Entity], e: Entity) -> dict[str, str]:
    """Values the templates of entity e can print."""
    a, info = e.attrs, e.info
    ref = lambda k: ents[a[k]].name if a.get(k) else ""  # noqa: E731
    he, his = ("he", "his") if info.get("gender") == "m" else ("she", "her") if e.type == "person" else ("it", "its")
    out = {"he": he, "his": his}
    if e.type == "person":
        out.update(occupation=a["occupation"], a_occupation=_a(a["occupation"]), nationality=ref("nationality"),
                   birth_year=str(a["birth_year"]), birthplace=ref("birthplace"), member_of=ref("member_of"),
                   spouse=ref("spouse"))
    elif e.type == "work":
        spec = _WORK_KINDS[info["kind"]]
        out.update({k: v for k, v in spec.items() if isinstance(v, str)}, kind=info["kind"], a_kind_w=_a(info["kind"]),
                   year=str(a["year"]), a_year=_a_year(a["year"]),
                   genre=a["genre"], a_genre=_a(a["genre"]), creator=ref("creator"))
    elif e.type == "org":
        out.update(kind=info["kind"], a_kind=_a(info["kind"]), founded_year=str(a["founded_year"]),
                   founded_by=ref("founded_by"), headquarters=ref("headquarters"))
    elif e.type == "city":
        out.update(country=ref("country"), population=f"{a['population']:,}", founded_year=str(a["founded_year"]))
    else:
        out.update(formal=info["formal"], capital=ref("capital"), language=a["language"])
    return out


def _refs(e: Entity, first: bool, rng: random.Random) -> dict[str, str]:
    """How a sentence names its subject: in full the first time, then as a reader would expect."""
    if first:
        return {"S": e.name, "s": e.name, "Pos": e.name + "'s", "pos": e.name + "'s"}
    if e.type == "person":
        if rng.random() < 0.6:
            he, his = ("he", "his") if e.info["gender"] == "m" else ("she", "her")
            return {"S": he.capitalize(), "s": he, "Pos": his.capitalize(), "pos": his}
        sur = e.info["surname"]
        return {"S": sur, "s": sur, "Pos": sur + "'s", "pos": sur + "'s"}
    noun = {"work": e.info.get("kind"), "org": e.info.get("short"), "city": "city", "country": "country"}[e.type]
    return {"S": f"The {noun}", "s": f"the {noun}", "Pos": "Its", "pos": "its"}


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


_SECTIONS = {"person": ("intro", "career", "life"), "work": ("intro", "production"), "org": ("intro", "history"),
             "city": ("intro", "history"), "country": ("intro", "culture")}


def _group_facts(ents: dict[str, Entity], e: Entity, group: str) -> list[tuple[str, str]]:
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
    base = _slots(ents, e)
    sentences, facts = [], []
    for i, g in enumerate(groups):
        slots = dict(base, **_refs(e, i == 0, rng))
        if g.startswith("work:"):
            w = ents[g[5:]]
            slots.update(title=w.name, kind=w.info["kind"], made=_WORK_KINDS[w.info["kind"]]["made"])
        key = (e.type, "work" if g.startswith("work:") else g)
        if i == gone:
            sentences.append(_sentence(_VAGUE[key], slots))
            continue
        sentences.append(_sentence(rng.choice(_FACT_TEMPLATES[key]), slots))
        facts += _group_facts(ents, e, g)
    fillers = list(_FILLERS[e.type])
    rng.shuffle(fillers)
    target = rng.randint(cfg.min_passage_words + 2, min(cfg.min_passage_words + 30, cfg.max_passage_words - 10))
    words = sum(len(s.split()) for s in sentences)
    for f in fillers:
        if words >= target:
            break
        s = _sentence(f, dict(base, **_refs(e, False, rng)))
        if words + len(s.split()) > cfg.max_passage_words:
            break
        sentences.insert(rng.randint(1, len(sentences)), s)  # never before the sentence that names the subject
        words += len(s.split())
    return " ".join(sentences), facts


def _sentence(template: str, slots: dict[str, str]) -> str:
    s = template.format(**slots)
    return s[0].upper() + s[1:]


def _distractor(cfg: WorldConfig, ents: dict[str, Entity], by_type: dict[str, list[Entity]],
                near: list[tuple[str, str]], kind: str, rng: random.Random) -> tuple[str, str, list[str]] | None:
    """(title, text, mentioned entity ids) of a passage that names entities but states none of
    their askable facts; the years and cities it prints are chosen to differ from the real ones,
    so it looks relevant to a dense retriever yet does not contain the answer."""
    cities = by_type["city"]
    year = rng.randint(1800, 2000)
    if kind == "event":
        city = rng.choice(cities)
        people = [p for p in rng.sample(by_type["person"], min(12, len(by_type["person"])))
                  if p.attrs["birthplace"] != city.id and p.attrs["birth_year"] != year][:3]
        if len(people) < 3:
            return None
        ek = rng.choice(_EVENT_KINDS)
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
    else:  # "disambiguation": a confusable near-name pair
        if not near:
            return None
        a, b = (ents[x] for x in rng.choice(near))
        noun = "person" if a.type == "person" else "place"
        title = f"{a.name} (disambiguation)"
        lead = [f"{a.name} may refer to more than one subject.",
                f"The name is often confused with {b.name}, a similar name that belongs to an unrelated {noun}.",
                "Readers should check dates and places carefully, since the two names are easily mixed up in catalogues."]
        mentioned = [a.id, b.id]
    fillers = list(_FILLERS["distractor"])
    rng.shuffle(fillers)
    text = lead
    while len(" ".join(text).split()) < cfg.min_passage_words + 5 and fillers:
        text = text + [fillers.pop()]
    return title, " ".join(text), mentioned


def _build_passages(cfg: WorldConfig, ents: dict[str, Entity], near: list[tuple[str, str]]
                    ) -> tuple[list[dict], list[dict], dict[tuple[str, str], list[str]]]:
    """Corpus rows, their metadata (entity, kind, section, stated facts) and fact -> passage ids."""
    rng = random.Random(derive_seed(cfg.seed, "corpus"))
    works_by: dict[str, list[str]] = {}
    for e in ents.values():
        if e.type == "work":
            works_by.setdefault(e.attrs["creator"], []).append(e.id)
    recs = []
    for e in ents.values():
        for section in _SECTIONS[e.type]:
            out = _realise(cfg, ents, works_by, e, section, 0)
            if out:
                recs.append({"title": e.name, "text": out[0], "entity": e.id, "kind": "main", "section": section,
                             "facts": out[1]})
    main = list(recs)
    for j, i in enumerate(rng.sample(range(len(main)), round(cfg.near_duplicate_rate * len(main)))):
        m, e = main[i], ents[main[i]["entity"]]
        # Mostly fact-less copies: they look as relevant as the gold passage to a dense retriever.
        out = _realise(cfg, ents, works_by, e, m["section"], 1, drop=True) if j % 3 else None
        kind = "ablated" if out else "paraphrase"
        for variant in range(2, 8):  # re-draw until the paraphrase really differs in wording
            if out and out[0] != m["text"]:
                break
            out = _realise(cfg, ents, works_by, e, m["section"], variant)
        recs.append({"title": e.name, "text": out[0], "entity": e.id, "kind": kind, "section": m["section"],
                     "facts": out[1]})
    by_type = {t: [e for e in ents.values() if e.type == t] for t in _TYPES}
    kinds = ["event", "adaptation", "prize", "archive", "disambiguation"]
    n_dis, tries = round(cfg.distractor_rate * len(main)), 0
    while n_dis > 0 and tries < 50 * len(main):
        tries += 1
        out = _distractor(cfg, ents, by_type, near, kinds[tries % len(kinds)], rng)
        if out:
            recs.append({"title": out[0], "text": out[1], "entity": ",".join(out[2]), "kind": "distractor",
                         "section": kinds[tries % len(kinds)], "facts": []})
            n_dis -= 1
    rng.shuffle(recs)  # ids carry no structure (an id-adjacency shortcut would be a leak)
    passages, meta, fact_passages = [], [], {}
    for pid, r in enumerate(recs):
        passages.append({"id": str(pid), "contents": f'"{r["title"]}"\n{r["text"]}'})
        meta.append({"id": str(pid), **{k: r[k] for k in ("entity", "kind", "section")},
                     "facts": [list(f) for f in r["facts"]]})
        for f in r["facts"]:
            fact_passages.setdefault(tuple(f), []).append(str(pid))
    return passages, meta, fact_passages


# ----------------------------------------------------------------------------- questions
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
_ASKABLE = {"person": ["birth_year", "birthplace", "occupation", "nationality", "spouse", "member_of"],
            "work": ["year", "creator", "genre"], "org": ["founded_year", "founded_by", "headquarters"],
            "city": ["country", "population", "founded_year"], "country": ["capital", "language"]}
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

    def __init__(self, world: "World", split: str, family: str):
        self.world, self.ents = world, world.entities
        self.rng = random.Random(derive_seed(world.config.seed, "questions", split, family))
        self.pool = {t: [e for e in world.entities.values() if e.type == t and e.split == split] for t in _TYPES}
        self.tags: Counter = Counter()

    def entity(self, etype: str | None = None) -> Entity:
        if etype is None:
            etype = self.rng.choices(list(_TYPE_WEIGHTS), list(_TYPE_WEIGHTS.values()))[0]
        return self.rng.choice(self.pool[etype])


def _answers(ents: dict[str, Entity], rel: str, value) -> list[str]:
    """Golden answers for a fact value; the first is the exact string the passages print."""
    if rel in _REF_RELATIONS:
        return _aliases(ents[value])
    if rel == "population":
        return [f"{value:,}", str(value)]
    if rel == "occupation":
        return [value] + _OCC_ALIASES.get(value, [])
    return [str(value)]


def _aliases(e: Entity) -> list[str]:
    # Countries may be named by their formal name; people only by their full name (a surname
    # alone would wrongly match a near-name such as "Venn" / "Vennor").
    return [e.name, e.info["formal"]] if e.type == "country" else [e.name]


def _named(e: Entity, quote: bool = True) -> str:
    return f"'{e.name}'" if quote and e.type == "work" else e.name


def _work_slots(e: Entity) -> dict[str, str]:
    if e.type != "work":
        return {}
    spec = _WORK_KINDS[e.info["kind"]]
    return {"kind": e.info["kind"], **{k: v for k, v in spec.items() if isinstance(v, str)}}


def _fill(template: str, x: str, subject: Entity) -> str:
    return template.format(X=x, Xc=x[0].upper() + x[1:], **_work_slots(subject))


def _hop(ctx: _QCtx, e: Entity, rel: str) -> dict:
    """One gold_chain row: a natural search query for the fact, its answer, the passages stating it."""
    return {"sub_query": _fill(_NQ_Q[rel][0], _named(e, False), e),
            "answer": _answers(ctx.ents, rel, e.attrs[rel])[0],
            "passage_ids": sorted(ctx.world.fact_passages[(e.id, rel)], key=int)}


def _q_single(ctx: _QCtx, style: str) -> _Draft | None:
    e = ctx.entity()
    rel = ctx.rng.choice([r for r in _ASKABLE[e.type] if e.attrs.get(r) is not None])
    if style == "nq":  # NQ questions are lower-case search-log queries without quotes or "?"
        q = _fill(ctx.rng.choice(_NQ_Q[rel]), _named(e, False), e).lower()
    else:
        q = _fill(_POPQA_Q[rel], _named(e, False), e)
    return _Draft(q, _answers(ctx.ents, rel, e.attrs[rel]), [_hop(ctx, e, rel)], [(e.id, rel)], [e.id])


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
    return _Draft(q, _answers(ctx.ents, last, cur.attrs[last]), [_hop(ctx, e, r) for e, r in steps],
                  [(e.id, r) for e, r in steps], [steps[0][0].id])


def _q_compare(ctx: _QCtx) -> _Draft | None:
    """"Which came first, A or B?"; the winner's position alternates so neither slot is a shortcut."""
    etype = ctx.rng.choice(list(_COMPARE))
    rel, templates = _COMPARE[etype]
    a, b = ctx.entity(etype), ctx.entity(etype)
    if a is b or a.attrs[rel] == b.attrs[rel] or (etype == "work" and a.info["kind"] != b.info["kind"]):
        return None
    template, direction = ctx.rng.choice(templates)
    winner = min((a, b), key=lambda e: e.attrs[rel]) if direction == "min" else max((a, b), key=lambda e: e.attrs[rel])
    loser = b if winner is a else a
    slot = "first" if ctx.tags["first"] <= ctx.tags["second"] else "second"
    first, second = (winner, loser) if slot == "first" else (loser, winner)
    q = template.format(A=_named(first), B=_named(second), **_work_slots(a))
    return _Draft(q, _aliases(winner), [_hop(ctx, first, rel), _hop(ctx, second, rel)],
                  [(first.id, rel), (second.id, rel)], [first.id, second.id], slot)


def _q_yesno(ctx: _QCtx) -> _Draft | None:
    """"Were A and B ... the same ...?", alternating the wanted answer so yes and no are balanced."""
    etype = ctx.rng.choice(list(_YESNO))
    rel, templates = _YESNO[etype]
    want = "yes" if ctx.tags["yes"] <= ctx.tags["no"] else "no"
    a = ctx.entity(etype)
    cands = [b for b in ctx.pool[etype] if b is not a and (b.attrs[rel] == a.attrs[rel]) == (want == "yes")
             and (etype != "work" or b.info["kind"] == a.info["kind"])]
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
    slots = _slots(ctx.ents, e)
    # Gold passages: those stating every clue fact at once (the intro), else the key fact.
    sets = [set(ctx.world.fact_passages[(e.id, r)]) for r in rels]
    gold = set.intersection(*sets) or sets[rels.index(key_rel)]
    hop = {"sub_query": clue.format(**slots), "answer": e.name, "passage_ids": sorted(gold, key=int)}
    return _Draft(ctx.rng.choice(phrasings).format(**slots), _aliases(e), [hop], [(e.id, r) for r in rels], [e.id])


_FAMILY_MAKERS: dict[str, list[tuple[float, Callable[[_QCtx], _Draft | None]]]] = {
    "syn_nq": [(1.0, lambda c: _q_single(c, "nq"))],
    "syn_triviaqa": [(1.0, _q_trivia)],
    "syn_popqa": [(1.0, lambda c: _q_single(c, "popqa"))],
    "syn_hotpotqa": [(0.7, lambda c: _q_chain(c, _HOTPOT_SPECS)), (0.3, _q_compare)],
    "syn_2wiki": [(0.35, _q_compare), (0.35, _q_yesno), (0.3, lambda c: _q_chain(c, _2WIKI_SPECS))],
    "syn_musique": [(1.0, lambda c: _q_chain(c, _MUSIQUE_SPECS))],
    "syn_bamboogle": [(1.0, lambda c: _q_chain(c, _BAMBOO_SPECS, hard=True))],
}


def _train_counts(n: int, mix: dict[str, float]) -> dict[str, int]:
    """Integer counts summing to n in proportion to mix (largest remainder, ties in family order)."""
    total = sum(mix.values())
    raw = {f: n * mix[f] / total for f in FAMILIES}
    counts = {f: int(v) for f, v in raw.items()}
    for f in sorted(FAMILIES, key=lambda f: -(raw[f] - counts[f]))[: n - sum(counts.values())]:
        counts[f] += 1
    return counts


def _make_split(world: "World", split: str, counts: dict[str, int], seen: set[str]) -> list[dict]:
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


# ----------------------------------------------------------------------------- world
@dataclass
class World:
    config: WorldConfig  # what generated it
    passages: list[dict]  # corpus rows {"id", "contents"}, ids "0".."n-1" in row order
    questions: dict[str, list[dict]]  # split -> Search-R1 rows
    entities: dict[str, Entity]  # id -> entity with its facts
    passage_meta: list[dict] = field(default_factory=list)  # per passage: entity, kind, section, stated facts
    fact_passages: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # fact -> ids of passages stating it
    question_meta: dict[str, dict] = field(default_factory=dict)  # question id -> {"facts", "anchors"} (leakage checks)
    near_names: list[tuple[str, str]] = field(default_factory=list)  # confusable (original, near-name) entity id pairs

    def clue_counts(self, etype: str, rels: tuple[str, ...]) -> Counter:
        """How many entities of a type share each combination of attribute values (cached)."""
        cache = self.__dict__.setdefault("_clue_cache", {})
        if (etype, rels) not in cache:
            cache[(etype, rels)] = Counter(tuple(e.attrs.get(r) for r in rels) + (e.info.get("kind"),)
                                           for e in self.entities.values() if e.type == etype)
        return cache[(etype, rels)]


def generate_world(cfg: WorldConfig) -> World:
    """Entities -> passages -> questions (test first, then dev, then train), all from cfg.seed."""
    ents, near = _build_entities(cfg, _template_words())
    passages, meta, fact_passages = _build_passages(cfg, ents, near)
    world = World(cfg, passages, {}, ents, meta, fact_passages, {}, near)
    seen: set[str] = set()
    for split in ("test", "dev", "train"):
        counts = (_train_counts(cfg.n_train_questions, cfg.train_mix) if split == "train" else
                  dict.fromkeys(FAMILIES, cfg.n_test_per_family if split == "test" else cfg.n_dev_per_family))
        world.questions[split] = _make_split(world, split, counts, seen)
    world.questions = {s: world.questions[s] for s in SPLITS}
    return world


# ----------------------------------------------------------------------------- files
_DATA_FILES = ("corpus.jsonl", "train.parquet", "dev.parquet", "test.parquet", "passage_meta.jsonl", "entities.jsonl")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")


def _counts(world: World) -> dict:
    return {"passages": dict(sorted(Counter(m["kind"] for m in world.passage_meta).items())),
            "entities": dict(sorted(Counter(e.type for e in world.entities.values()).items())),
            "questions": {s: dict(sorted(Counter(r["data_source"] for r in rows).items()))
                          for s, rows in world.questions.items()}}


def world_paths(out_dir: str | Path) -> dict[str, Path]:
    """Where the files of a world written to out_dir are (keys: file stems, e.g. "corpus", "train")."""
    out = Path(out_dir)
    return {name.split(".")[0]: out / name for name in (*_DATA_FILES, "world.json")}


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl, {train,dev,test}.parquet, passage_meta.jsonl, entities.jsonl and world.json.

    Atomic per world: everything is written into a temp folder inside out_dir, the old manifest is
    removed first, files are renamed into place, and world.json (the fingerprint build_world
    trusts) is renamed last; a crash at any point leaves no manifest vouching for partial files.
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".world-tmp-", dir=out))
    try:
        _write_jsonl(tmp / "corpus.jsonl", world.passages)
        for split in SPLITS:
            pd.DataFrame(world.questions[split]).to_parquet(tmp / f"{split}.parquet", engine="pyarrow", index=False)
        _write_jsonl(tmp / "passage_meta.jsonl", world.passage_meta)
        _write_jsonl(tmp / "entities.jsonl", [{"id": e.id, "type": e.type, "name": e.name, "split": e.split,
                                               "attrs": e.attrs, "info": e.info} for e in world.entities.values()])
        manifest = {"fingerprint": world_fingerprint(world.config), "generator_version": GENERATOR_VERSION,
                    "config": asdict(world.config), "counts": _counts(world),
                    "files": {n: (tmp / n).stat().st_size for n in _DATA_FILES}}
        (tmp / "world.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (out / "world.json").unlink(missing_ok=True)
        for name in _DATA_FILES:
            os.replace(tmp / name, out / name)
        os.replace(tmp / "world.json", out / "world.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return world_paths(out)


def read_manifest(out_dir: str | Path) -> dict | None:
    """The world.json of a written world, or None when absent or unreadable."""
    try:
        return json.loads((Path(out_dir) / "world.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def build_world(cfg: WorldConfig, out_dir: str | Path, force: bool = False) -> dict[str, Path]:
    """Reuse the world in out_dir when its manifest matches cfg and its files are intact, else
    generate and write it. Returns the file paths (see world_paths)."""
    m = read_manifest(out_dir)
    paths = world_paths(out_dir)
    intact = m is not None and all((Path(out_dir) / n).is_file() and (Path(out_dir) / n).stat().st_size == size
                                   for n, size in m.get("files", {}).items()) and set(m.get("files", {})) == set(_DATA_FILES)
    if not force and intact and m.get("fingerprint") == world_fingerprint(cfg):
        return paths
    return write_world(generate_world(cfg), out_dir)


def world_summary(world: World):
    """A tidy table for the notebook: one row per (split, family) of questions and one per passage
    kind, with counts, mean words, mean hops and the yes/no shares."""
    import pandas as pd

    rows = []
    for split, qs in world.questions.items():
        for fam in FAMILIES:
            sel = [q for q in qs if q["data_source"] == fam]
            if not sel:
                continue
            ans = [q["golden_answers"][0] for q in sel]
            rows.append({"section": "questions", "split": split, "name": fam, "group": FAMILIES[fam].group,
                         "count": len(sel), "mean_words": sum(len(q["question"].split()) for q in sel) / len(sel),
                         "mean_hops": sum(q["extra_info"]["hops"] for q in sel) / len(sel),
                         "share_yes": ans.count("yes") / len(sel), "share_no": ans.count("no") / len(sel)})
    for kind in ("main", "paraphrase", "ablated", "distractor"):
        sel = [p for p, m in zip(world.passages, world.passage_meta) if m["kind"] == kind]
        if sel:
            rows.append({"section": "passages", "split": "corpus", "name": kind, "group": "", "count": len(sel),
                         "mean_words": sum(len(p["contents"].split("\n", 1)[1].split()) for p in sel) / len(sel)})
    return pd.DataFrame(rows)
