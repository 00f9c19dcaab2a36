"""The embedded world: a seeded, fictional encyclopedia plus QA in the Search-R1 row schema.

Why fictional: every name and fact is made up, so no language model can answer from memory and
retrieval is required, exactly the setting CoSearch studies. The world is the project's default
data set: ``corpus.jsonl`` in the wiki-18 row format (``{"id", "contents"}``, contents = quoted
title line + text) and ``train/dev/test.parquet`` in the Search-R1 schema, so the same code reads
it and the real benchmarks.

How it is built (each module keeps the next honest):

* ``config``: the question families and ``WorldConfig`` (every knob documented there).
* ``names`` / ``entities``: entities with syllable-made names and relations (birthplace, founder,
  author, ...) so multi-hop chains exist; every entity belongs to one component (train, dev or
  test) and relations never cross components, so no fact, anchor or question text is shared
  across splits. Confusable near-names ("Venn" / "Vennor") and namesakes (two "Aldric Venn"s).
* ``text`` / ``passages``: the corpus. Articles cut into passages of 60-150 words with facts
  spread over sections, some worded unlike the questions; near-duplicates; distractors; and
  incoming mentions (other entities' sentences that name the subject with a fact's words but a
  different value): the hard negatives that make a dense retriever good but imperfect at K = 5.
* ``questions``: seven families mirroring the paper's seven benchmarks (``FAMILIES``), each row
  with a ``gold_chain`` (per hop: sub-query, answer, ids of the passages stating it).
* ``generate`` / ``io``: ``generate_world`` and writing/caching (``build_world``).

Only ``random.Random`` instances seeded through :func:`cosearch_lib.seeding.derive_seed` are
used (never global RNG state), so one config always gives byte-identical files.
"""
