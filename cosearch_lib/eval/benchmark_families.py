"""Which data sets count as single-hop and which as multi-hop, for the paper's grouped averages.

The paper reports single-hop avg (NQ, TriviaQA, PopQA), multi-hop avg (HotpotQA, 2Wiki, MuSiQue,
Bamboogle) and the overall average over the seven. The embedded world's families mirror them one
to one (``syn_nq`` mirrors ``nq``, ...), so the same tables work on both.
"""

from __future__ import annotations

PAPER_BENCHMARKS: dict[str, str] = {
    "nq": "single", "triviaqa": "single", "popqa": "single",
    "hotpotqa": "multi", "2wikimultihopqa": "multi", "musique": "multi", "bamboogle": "multi",
}
#: Display order of the paper's tables.
BENCHMARK_ORDER = list(PAPER_BENCHMARKS)
_SYN_PREFIX = "syn_"
_ALIASES = {"2wiki": "2wikimultihopqa"}


def mirrored_benchmark(data_source: str) -> str:
    """``"syn_2wiki"`` -> ``"2wikimultihopqa"``; a paper benchmark name maps to itself."""
    name = data_source.lower()
    if name.startswith(_SYN_PREFIX):
        name = name[len(_SYN_PREFIX):]
    return _ALIASES.get(name, name)


def hop_group(data_source: str) -> str:
    """``"single"`` or ``"multi"``; ``"other"`` for data sets outside the paper's seven."""
    return PAPER_BENCHMARKS.get(mirrored_benchmark(data_source), "other")


def in_families(data_source: str, families: tuple[str, ...] | list[str]) -> bool:
    """Whether ``data_source`` is one of ``families``: data-source names, or ``"single"`` /
    ``"multi"`` for every data set of that hop group (:func:`hop_group`); empty: every family."""
    return not families or data_source in families or hop_group(data_source) in families


def order_key(data_source: str) -> tuple[int, str]:
    """Sort key that puts data sets in the paper's column order."""
    bench = mirrored_benchmark(data_source)
    return (BENCHMARK_ORDER.index(bench) if bench in BENCHMARK_ORDER else len(BENCHMARK_ORDER), data_source)
