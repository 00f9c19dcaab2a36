"""Where the corpus and the questions come from: the embedded synthetic world, or real files."""

from __future__ import annotations

from dataclasses import dataclass, field

from cosearch_lib.config.checks import LOCATION_ONLY, ConfigError, Fields


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
        check = Fields("world", self)
        try:
            self.split_fractions = tuple(float(x) for x in self.split_fractions)  # YAML gives a list
        except (TypeError, ValueError):
            raise check.fail("split_fractions", "three positive shares") from None
        check.ints("n_people", "n_works", "n_orgs", "n_cities", "n_countries", minimum=6, why="two per component")
        if len(self.split_fractions) != 3 or min(self.split_fractions) <= 0:
            raise check.fail("split_fractions", "three positive shares")
        check.numbers(*_RATES, low=0, high=1)
        check.numbers("mention_pages", low=0, high=5)
        check.ints("mention_sentences", minimum=1, maximum=6)
        shares = self.train_mix.values() if isinstance(self.train_mix, dict) else ()
        if set(self.train_mix) != set(_default_mix()) or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in shares):
            raise check.fail("train_mix", f"a share >= 0 for each of {sorted(_default_mix())}")
        check.ints("min_passage_words", "max_passage_words")
        if not 20 <= self.min_passage_words < self.max_passage_words - 30:
            raise ConfigError("need 20 <= world.min_passage_words < world.max_passage_words - 30, got "
                              f"min_passage_words={self.min_passage_words}, max_passage_words={self.max_passage_words}")

    @classmethod
    def tiny(cls, seed: int = 0) -> WorldConfig:
        """A world of ~500 passages for CI and quick demos (generates in a fraction of a second)."""
        return cls(seed=seed, n_people=50, n_works=40, n_orgs=14, n_cities=14, n_countries=8,
                   n_train_questions=100, n_dev_per_family=5, n_test_per_family=10)


@dataclass
class DataConfig:
    """Real files for cluster runs. Relative paths resolve against ``root`` (itself relative to the
    project root), so a profile's whole data layout moves with one key: ``paper`` reads
    ``data/wiki18/...`` and ``data/cosearch/...``, its CPU miniature the same layout under
    ``data/paper_mini/``. ``cosearch download ... --profile P`` writes each file where P reads it."""

    root: str = field(default=".", metadata=LOCATION_ONLY)  # folder the relative paths below resolve against (relative: to the project root)
    corpus_path: str | None = None  # wiki-18-format corpus (.jsonl/.jsonl.gz); None = the embedded world
    index_path: str | None = None  # prebuilt FAISS index for that corpus (e.g. wiki-18 e5_Flat.index); None = build and cache
    qa_paths: dict[str, str] = field(default_factory=dict)  # split -> QA file or folder (Search-R1/CoSearch parquet, FlashRAG jsonl); empty = the world's splits

    def __post_init__(self) -> None:
        if not isinstance(self.root, str) or not self.root:
            raise ConfigError(f"data.root: expected a folder path (a non-empty string), got {self.root!r}")
        if not isinstance(self.qa_paths, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in self.qa_paths.items()):
            raise ConfigError(f"data.qa_paths: expected a mapping of split -> path, got {self.qa_paths!r}")
