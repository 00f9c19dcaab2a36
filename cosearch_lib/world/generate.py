"""The one entry point that makes a world: entities -> passages -> questions."""

from __future__ import annotations

from cosearch_lib.config import WorldConfig
from cosearch_lib.world.built_world import World
from cosearch_lib.world.entities import build_entities
from cosearch_lib.world.families import FAMILIES, SPLITS
from cosearch_lib.world.passages import build_passages
from cosearch_lib.world.questions import make_split, train_counts
from cosearch_lib.world.text import template_words


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
