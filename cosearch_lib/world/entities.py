"""Entities and their facts: countries, cities, people, organisations and works.

Every entity belongs to one *component* (train, dev or test) and relations never cross
components, so a question of split s only uses facts of component s (no leakage by construction).
Confusable names are made on purpose: near-names ("Aldric Venn" / "Aldric Vennor") and namesakes
(two people both called "Aldric Venn", told apart by occupation: "Aldric Venn (composer)").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cosearch_lib.config import WorldConfig
from cosearch_lib.seeding import derive_seed
from cosearch_lib.world.families import SPLITS, TYPES
from cosearch_lib.world.names import Namer, make_title, near_title


@dataclass
class Entity:
    id: str  # "<type>:<n>", e.g. "person:12"
    type: str  # country, city, person, org or work
    name: str  # display name (a work's title); namesakes share it
    split: str  # component: train, dev or test
    attrs: dict = field(default_factory=dict)  # relation -> literal (int/str) or entity id; these are the askable facts
    info: dict = field(default_factory=dict)  # descriptive, never asked: gender, kind, surname, formal name, disambig

    @property
    def title(self) -> str:
        """Article title: the name, plus "(occupation)" for a namesake, as Wikipedia disambiguates."""
        return f"{self.name} ({self.info['disambig']})" if self.info.get("disambig") else self.name


REF_RELATIONS = {"birthplace", "nationality", "spouse", "member_of", "founded_by", "headquarters",
                 "country", "capital", "creator"}
OCCUPATIONS = {"novelist": 16, "poet": 6, "historian": 5, "film director": 12, "composer": 8, "singer": 6,
               "painter": 8, "architect": 7, "chemist": 6, "astronomer": 5, "politician": 8, "engineer": 7,
               "cartographer": 3, "sculptor": 3}
OCC_ALIASES = {"film director": ["director"]}
WORK_KINDS = {  # kind -> verbs and nouns used in text and questions, and who can make one
    "novel": dict(made="wrote", made_pp="written", role="author", released="published",
                  creators=("novelist", "poet", "historian"),
                  genres=("mystery", "historical", "fantasy", "satirical", "gothic", "adventure")),
    "film": dict(made="directed", made_pp="directed", role="director", released="released",
                 creators=("film director",), genres=("drama", "comedy", "thriller", "documentary", "western")),
    "album": dict(made="recorded", made_pp="recorded", role="performer", released="released",
                  creators=("composer", "singer"), genres=("folk", "jazz", "choral", "ballad", "orchestral")),
}
ORG_KINDS = [  # (kind, short noun for later mentions, name suffixes)
    ("publishing house", "press", ["Press", "Books"]), ("film studio", "studio", ["Pictures", "Studios"]),
    ("record label", "label", ["Records"]), ("university", "university", ["University", "College"]),
    ("shipping company", "company", ["Shipping Company", "Lines"]), ("bank", "bank", ["Bank"]),
    ("observatory", "observatory", ["Observatory"]), ("museum", "museum", ["Museum"]),
    ("orchestra", "orchestra", ["Philharmonic", "Orchestra"]), ("trading company", "company", ["Trading Company"]),
]
FORMAL = ["Republic of", "Kingdom of", "Federation of", "Grand Duchy of", "Commonwealth of"]
_CITY_SUFFIX = ("mar", "holt", "ford", "wick", "stad", "by", "mere", "dale", "port", "haven", "ton", "burg", "")
_SURNAME_SUFFIX = ("", "", "en", "ard", "ley", "mont", "wick", "er", "ov")
_GIVEN_SUFFIX = ("", "", "a", "in", "el", "ric", "wen")


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


class _Builder:
    """Builds the entities type by type; each step only links to entities of its own component."""

    def __init__(self, cfg: WorldConfig, blocked: set[str]):
        self.cfg = cfg
        self.rng = random.Random(derive_seed(cfg.seed, "entities"))
        self.namer = Namer(random.Random(derive_seed(cfg.seed, "names")), blocked)
        self.ents: dict[str, Entity] = {}
        self.near: list[tuple[str, str]] = []  # confusable (original, near-name) pairs
        self.namesakes: list[tuple[str, str]] = []  # (earlier, later) people sharing one exact name
        self.org_names: set[str] = set()
        self.roots: dict[str, str] = {}  # entity id -> the word its confusable name was derived from
        self.by: dict[tuple[str, str], list[Entity]] = {(t, s): [] for t in TYPES for s in SPLITS}

    def variant(self, base: Entity, word: str) -> str | None:
        """A confusable variant of ``word`` (base's name), or of the root it was derived from once
        names grow long, so clusters of look-alikes keep growing ("Venn", "Vennor", "Vennora",
        "Vanner") without names like "Vennororen". Large clusters are what make exact-name
        retrieval imperfect: every look-alike's passages compete for a search."""
        if len(word) <= 9:
            new = self.namer.near(word)
            if new:
                return new
        return self.namer.near(self.roots.get(base.id, word))

    def add(self, e: Entity) -> Entity:
        self.ents[e.id] = e
        self.by[(e.type, e.split)].append(e)
        return e

    def labels(self, what: str, minimum: int | dict[str, int] = 2) -> list[str]:
        minimum = minimum if isinstance(minimum, dict) else dict.fromkeys(SPLITS, minimum)
        return _components(what, getattr(self.cfg, what), self.cfg.split_fractions, minimum, self.rng)

    def countries(self) -> None:
        for i, split in enumerate(self.labels("n_countries")):
            name = self.namer.fresh((1, 2), ("ia", "ara", "ova", "enne", "oria", "and"))
            lang = self.namer.fresh((1, 2), ("ish", "ic", "ese", "i"))
            self.add(Entity(f"country:{i}", "country", name, split, {"language": lang},
                            {"formal": f"{self.rng.choice(FORMAL)} {name}"}))

    def cities(self) -> None:
        rng = self.rng
        # Every country needs a city (its capital), so a component gets at least as many cities.
        need = {s: max(2, len(self.by[("country", s)])) for s in SPLITS}
        for i, split in enumerate(self.labels("n_cities", need)):
            earlier = [e for s in SPLITS for e in self.by[("city", s)]]
            base, name = None, None
            if earlier and rng.random() < self.cfg.near_name_rate:
                base = rng.choice(earlier)
                name = self.variant(base, base.name)
            city = self.add(Entity(f"city:{i}", "city", name or self.namer.fresh((1, 2), _CITY_SUFFIX), split,
                                   {"population": rng.randint(2, 900) * 1000 + rng.randint(0, 9) * 100,
                                    "founded_year": rng.randint(850, 1750)}))
            if name:
                self.near.append((base.id, city.id))
                self.roots[city.id] = self.roots.get(base.id, base.name)
        for split in SPLITS:
            countries, cities = self.by[("country", split)], self.by[("city", split)]
            for j, city in enumerate(cities):  # round-robin first, so each country has a city
                city.attrs["country"] = countries[j].id if j < len(countries) else rng.choice(countries).id
            for c in countries:
                c.attrs["capital"] = rng.choice([x for x in cities if x.attrs["country"] == c.id]).id

    def _person_name(self, givens: list[str], clustered: list[Entity]) -> tuple[str, str, Entity | None, Entity | None]:
        """(given, surname, near-name base, namesake base): a fresh name, a confusable variant of
        an earlier surname, or exactly an earlier person's name."""
        rng, earlier = self.rng, [e for s in SPLITS for e in self.by[("person", s)]]
        roll = rng.random()
        if earlier and roll < self.cfg.namesake_rate:
            free = [e for e in earlier if not e.info.get("disambig")]
            if free:
                twin = rng.choice(free)
                return twin.info["given"], twin.info["surname"], None, twin
        if earlier and roll < self.cfg.namesake_rate + self.cfg.near_name_rate:
            # Often extend an existing cluster ("Venn", "Vennor", "Venna"): several look-alike
            # people compete for one name, which is what makes exact-name retrieval imperfect.
            base = rng.choice(clustered if clustered and rng.random() < 0.6 else earlier)
            surname = self.variant(base, base.info["surname"])
            if surname:
                return base.info["given"], surname, base, None
        return rng.choice(givens), self.namer.fresh((1, 2), _SURNAME_SUFFIX), None, None

    def people(self) -> None:
        rng = self.rng
        # A small pool of given names: many people share one, as in real encyclopedias.
        givens = [self.namer.fresh((1, 2), _GIVEN_SUFFIX, max_len=8) for _ in range(max(30, self.cfg.n_people // 8))]
        occ_names, occ_weights = list(OCCUPATIONS), list(OCCUPATIONS.values())
        forced = ["novelist", "film director", "composer"]  # each component can make every kind of work
        clustered: list[Entity] = []  # people in a near-name pair
        for i, split in enumerate(self.labels("n_people", 4)):
            k = len(self.by[("person", split)])
            given, surname, base, twin = self._person_name(givens, clustered)
            if k < 3:
                occ = forced[k]
            else:
                occ = rng.choices(occ_names, occ_weights)[0]
            while twin and occ == twin.attrs["occupation"]:  # namesakes differ in occupation: the disambiguator
                occ = rng.choices(occ_names, occ_weights)[0]
            city = rng.choice(self.by[("city", split)])
            home = self.ents[city.attrs["country"]]
            others = [c for c in self.by[("country", split)] if c is not home]
            p = self.add(Entity(f"person:{i}", "person", f"{given} {surname}", split,
                                {"occupation": occ, "birth_year": rng.randint(1780, 1960), "birthplace": city.id,
                                 "nationality": (home if rng.random() < 0.7 else rng.choice(others)).id},
                                {"given": given, "surname": surname, "gender": rng.choice("mf")}))
            if base:
                self.near.append((base.id, p.id))
                self.roots[p.id] = self.roots.get(base.id, base.info["surname"])
                clustered += [base, p]
            if twin:
                twin.info["disambig"], p.info["disambig"] = twin.attrs["occupation"], occ
                self.namesakes.append((twin.id, p.id))

    def orgs(self) -> None:
        rng = self.rng
        for i, split in enumerate(self.labels("n_orgs")):
            kind, short, suffixes = rng.choice(ORG_KINDS)
            people = self.by[("person", split)]
            taken = {o.attrs["founded_by"] for o in self.by[("org", split)]}
            founder = rng.choice([p for p in people if p.id not in taken] or people)
            name, base = self._org_name(suffixes)
            org = self.add(Entity(f"org:{i}", "org", name, split,
                                  {"founded_year": founder.attrs["birth_year"] + rng.randint(25, 60),
                                   "founded_by": founder.id, "headquarters": rng.choice(self.by[("city", split)]).id},
                                  {"kind": kind, "short": short}))
            if base:
                self.near.append((base.id, org.id))
                self.roots[org.id] = self.roots.get(base.id, base.name.split(" ", 1)[0])

    def _org_name(self, suffixes: list[str]) -> tuple[str, Entity | None]:
        """A fresh word plus a kind suffix, or (near_name_rate) an earlier organisation's word,
        or a confusable variant of it, with another suffix ("Heiba Records" / "Heiba Studios")."""
        rng, earlier = self.rng, [e for s in SPLITS for e in self.by[("org", s)]]
        if earlier and rng.random() < self.cfg.near_name_rate:
            base = rng.choice(earlier)
            word, sfx = base.name.split(" ", 1)
            if rng.random() < 0.5:
                word = self.variant(base, word) or word
            options = [x for x in suffixes if f"{word} {x}" not in self.org_names]
            if options:
                name = f"{word} {rng.choice(options)}"
                self.org_names.add(name)
                return name, base
        name = f"{self.namer.fresh((1, 2))} {rng.choice(suffixes)}"
        self.org_names.add(name)
        return name, None

    def memberships_and_marriages(self) -> None:
        rng = self.rng
        for split in SPLITS:
            people = list(self.by[("person", split)])
            for p in people:
                if rng.random() < self.cfg.member_rate:
                    p.attrs["member_of"] = rng.choice(self.by[("org", split)]).id
            rng.shuffle(people)
            n_married = int(len(people) * self.cfg.spouse_rate) // 2 * 2
            for a, b in zip(people[0:n_married:2], people[1:n_married:2]):
                a.attrs["spouse"], b.attrs["spouse"] = b.id, a.id

    def works(self) -> None:
        rng, titles = self.rng, set()
        for i, split in enumerate(self.labels("n_works")):
            kind = rng.choice(list(WORK_KINDS))
            spec = WORK_KINDS[kind]
            maker = rng.choice([p for p in self.by[("person", split)] if p.attrs["occupation"] in spec["creators"]])
            earlier = [e for s in SPLITS for e in self.by[("work", s)]]
            base = rng.choice(earlier) if earlier and rng.random() < self.cfg.near_name_rate else None
            title = near_title(rng, base.name, titles) if base else None
            work = self.add(Entity(f"work:{i}", "work", title or make_title(rng, self.namer, titles), split,
                                   {"year": maker.attrs["birth_year"] + rng.randint(22, 60),
                                    "genre": rng.choice(spec["genres"]), "creator": maker.id}, {"kind": kind}))
            if title:
                self.near.append((base.id, work.id))


def build_entities(cfg: WorldConfig, blocked: set[str]
                   ) -> tuple[dict[str, Entity], list[tuple[str, str]], list[tuple[str, str]]]:
    """All entities with their facts, the near-name pairs and the namesake pairs."""
    b = _Builder(cfg, blocked)
    b.countries()
    b.cities()
    b.people()
    b.orgs()
    b.memberships_and_marriages()
    b.works()
    return b.ents, b.near, b.namesakes


# ----------------------------------------------------------------------------- facts and their answers
ASKABLE = {"person": ["birth_year", "birthplace", "occupation", "nationality", "spouse", "member_of"],
           "work": ["year", "creator", "genre"], "org": ["founded_year", "founded_by", "headquarters"],
           "city": ["country", "population", "founded_year"], "country": ["capital", "language"]}


def answers(ents: dict[str, Entity], rel: str, value) -> list[str]:
    """Golden answers for a fact value; the first is the exact string the passages print."""
    if rel in REF_RELATIONS:
        return aliases(ents[value])
    if rel == "population":
        return [f"{value:,}", str(value)]
    if rel == "occupation":
        return [value] + OCC_ALIASES.get(value, [])
    return [str(value)]


def aliases(e: Entity) -> list[str]:
    # Countries may be named by their formal name; people only by their full name (a surname
    # alone would wrongly match a near-name such as "Venn" / "Vennor").
    return [e.name, e.info["formal"]] if e.type == "country" else [e.name]
