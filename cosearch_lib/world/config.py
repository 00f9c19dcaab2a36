"""What a world is made of: the question families, the generator's knobs and the cache key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

#: Bump when the generator's output changes, so cached worlds built by older code are rebuilt.
#: 2: incoming mentions (hard negatives), namesakes, indirect phrasings, longer passages.
GENERATOR_VERSION = 2
SPLITS = ("train", "dev", "test")
TYPES = ("country", "city", "person", "org", "work")


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


_RATES = ("near_duplicate_rate", "distractor_rate", "near_name_rate", "namesake_rate", "indirect_rate",
          "spouse_rate", "member_rate")


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
    near_duplicate_rate: float = 0.30  # near-duplicate passages per main passage (1/3 paraphrases, 2/3 missing one fact)
    distractor_rate: float = 0.10  # distractor passages per main passage (mention entities, state none of their facts)
    near_name_rate: float = 0.8  # share of people, cities, organisations and works named after a confusable earlier name (look-alikes compete for every search)
    namesake_rate: float = 0.10  # share of people who share the exact name of an earlier person (other occupation; titles and questions disambiguate)
    mention_pages: float = 1.0  # hard negatives per entity: "Circle of X"-style passages naming X whose sentences state *other* entities' values of X's relations, in the questions' words
    mention_sentences: int = 3  # such sentences per mention passage, each about a different relation of X
    indirect_rate: float = 0.5  # share of fact sentences worded unlike the questions ("a native of" for "born in")
    spouse_rate: float = 0.5  # share of people married to another person of their component
    member_rate: float = 0.8  # share of people who work for an organisation
    min_passage_words: int = 60  # passages are padded with neutral sentences up to at least this many words
    max_passage_words: int = 150  # and never exceed this many words
    train_mix: dict[str, float] = field(default_factory=_default_mix)  # family -> share of the training questions

    def __post_init__(self) -> None:
        self.split_fractions = tuple(float(x) for x in self.split_fractions)  # YAML gives a list
        for name in ("n_people", "n_works", "n_orgs", "n_cities", "n_countries"):
            if getattr(self, name) < 6:
                raise ValueError(f"WorldConfig.{name} must be >= 6 (two per component), got {getattr(self, name)}")
        if len(self.split_fractions) != 3 or min(self.split_fractions) <= 0:
            raise ValueError(f"WorldConfig.split_fractions must be three positive shares, got {self.split_fractions}")
        for name in _RATES:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorldConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.mention_pages <= 5.0:
            raise ValueError(f"WorldConfig.mention_pages must be in [0, 5], got {self.mention_pages}")
        if not 1 <= self.mention_sentences <= 6:
            raise ValueError(f"WorldConfig.mention_sentences must be in 1..6, got {self.mention_sentences}")
        if set(self.train_mix) != set(FAMILIES) or min(self.train_mix.values()) < 0:
            raise ValueError(f"WorldConfig.train_mix needs a share >= 0 for each of {sorted(FAMILIES)}, "
                             f"got {self.train_mix}")
        if not 20 <= self.min_passage_words < self.max_passage_words - 30:
            raise ValueError("WorldConfig needs 20 <= min_passage_words < max_passage_words - 30, got "
                             f"{self.min_passage_words}, {self.max_passage_words}")

    @classmethod
    def tiny(cls, seed: int = 0) -> "WorldConfig":
        """A world of ~500 passages for CI and quick demos (generates in a fraction of a second)."""
        return cls(seed=seed, n_people=50, n_works=40, n_orgs=14, n_cities=14, n_countries=8,
                   n_train_questions=100, n_dev_per_family=5, n_test_per_family=10)


def world_fingerprint(cfg: WorldConfig) -> str:
    """Stable hash of the config and generator version: the cache key of a written world."""
    blob = json.dumps({"config": asdict(cfg), "generator_version": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
