"""The World record and the one entry point that makes it: entities -> passages -> questions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .config import FAMILIES, SPLITS, WorldConfig
from .entities import Entity, build_entities
from .passages import build_passages
from .questions import make_split, train_counts
from .text import template_words


@dataclass
class World:
    config: WorldConfig  # what generated it
    passages: list[dict]  # corpus rows {"id", "contents"}, ids "0".."n-1" in row order
    questions: dict[str, list[dict]]  # split -> Search-R1 rows
    entities: dict[str, Entity]  # id -> entity with its facts
    passage_meta: list[dict] = field(default_factory=list)  # per passage: entity, kind, section, stated facts, mentions
    fact_passages: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # fact -> ids of passages stating it
    question_meta: dict[str, dict] = field(default_factory=dict)  # question id -> {"facts", "anchors"} (leakage checks)
    near_names: list[tuple[str, str]] = field(default_factory=list)  # confusable (original, near-name) entity id pairs
    namesakes: list[tuple[str, str]] = field(default_factory=list)  # (earlier, later) people sharing an exact name

    def clue_counts(self, etype: str, rels: tuple[str, ...]) -> Counter:
        """How many entities of a type share each combination of attribute values (cached)."""
        cache = self.__dict__.setdefault("_clue_cache", {})
        if (etype, rels) not in cache:
            cache[(etype, rels)] = Counter(tuple(e.attrs.get(r) for r in rels) + (e.info.get("kind"),)
                                           for e in self.entities.values() if e.type == etype)
        return cache[(etype, rels)]


def generate_world(cfg: WorldConfig) -> World:
    """Entities -> passages -> questions (test first, then dev, then train), all from cfg.seed."""
    ents, near, namesakes = build_entities(cfg, template_words())
    passages, meta, fact_passages = build_passages(cfg, ents, near, namesakes)
    world = World(cfg, passages, {}, ents, meta, fact_passages, {}, near, namesakes)
    seen: set[str] = set()
    for split in ("test", "dev", "train"):
        counts = (train_counts(cfg.n_train_questions, cfg.train_mix) if split == "train" else
                  dict.fromkeys(FAMILIES, cfg.n_test_per_family if split == "test" else cfg.n_dev_per_family))
        world.questions[split] = make_split(world, split, counts, seen)
    world.questions = {s: world.questions[s] for s in SPLITS}
    return world
