"""What a training run writes, and how it is read back: the run folder's file names, the columns of
its records (the metric glossaries), and whole-checkpoint checks.

The trainer (``rl.trainer``) writes these files and ``records.training_runs`` reads them; both take
the names from here, and this module imports nothing heavy (no torch, no pandas), so reading a
run's records does not load the trainer. ``docs/METRICS.md`` is generated from the glossaries.

A training run's folder (``papermill_runs/<profile>/training/<method>/``)::

    steps.csv                     one row per step (STEP_GLOSSARY)
    ranker_calls.parquet          one row per ranker call (rl.rewards.REWARD_GLOSSARY and its group)
    validation.csv                one row per validation item and validation (VALIDATION_GLOSSARY)
    checkpoints/step_N/           state.pt, adapters/ (peft folders), config.json, MANIFEST.json (last)
    live_adapters/                adapters a disk-reading backend (vLLM) serves
    tb/                           TensorBoard events (training.log_to)
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.metrics import hit_cutoffs, hit_label

STEPS_FILE = "steps.csv"
RANKER_CALLS_FILE = "ranker_calls.parquet"
VALIDATION_FILE = "validation.csv"
CHECKPOINTS_DIR = "checkpoints"
LIVE_ADAPTERS_DIR = "live_adapters"
TRACKER_DIR = "tb"

#: Decimals the notebooks' ``*.metrics.json`` keep (notebooks 02-05): RESULTS.md rounds them to 3 once (at 4,
#: 0.30952 was saved as 0.3095 and printed 0.309).
METRIC_DIGITS = 6

#: How a Hit column reads in the glossaries: ``hit@<k>`` stands for one column per cutoff k of the
#: profile's ``training.ranker_reward.hit_ks`` below K (``hit@1`` at K = 2; ``hit@1``, ``hit@3`` at
#: K = 5), ``hit@K`` for the whole list of K passages shown (``metrics.hit_cutoffs``, ``hit_label``).
HIT_PATTERN, HIT_WHOLE_LIST = "hit@<k>", "hit@K"


def hit_names(hit_ks: Sequence[int], k_shown: int) -> list[str]:
    """The Hit columns (without prefix) of cutoffs ``hit_ks`` at K shown passages: ``["hit@1", "hit@K"]``
    for the paper's {1, 3, 5} at K = 2."""
    return [hit_label(k, k_shown) for k in hit_cutoffs(hit_ks, k_shown)]


def expand_hit_patterns(names: Sequence[str], hits: Sequence[str]) -> list[str]:
    """Glossary keys as columns: each ``<prefix>hit@<k>`` becomes ``<prefix>`` + every name of ``hits``
    (``hit_names``), its ``<prefix>hit@K`` dropped (``hits`` ends with it); other keys stay."""
    out: list[str] = []
    for name in names:
        if name.endswith(HIT_PATTERN):
            out += [name[: -len(HIT_PATTERN)] + h for h in hits]
        elif not name.endswith(HIT_WHOLE_LIST):
            out.append(name)
    return out

#: What the per-policy columns of a step record start with: a role's GRPO stats (``<role>_``) or an
#: adapter's optimizer stats (``<adapter>_``): agent, ranker, the shared backbone's adapter, or the
#: scoring ranker (:data:`SCORER_SLOT`).
STAT_PREFIXES = ("agent", "ranker", "shared", "scorer")


#: The namespaces of a step record's metric keys, as cleanrl's (``losses/``, ``charts/``), so that
#: TensorBoard and the tables group them by what they measure:
#: ``rollout/`` the agent's trajectories, ``ranker/`` the ranker's calls, rewards and groups,
#: ``loss/`` each role's GRPO statistics and each adapter's gradient norm, ``time/`` the stage
#: seconds, ``val/`` the held-out validation. ``step`` and ``method`` carry none.
METRIC_NAMESPACES = ("rollout", "ranker", "loss", "time", "val")
#: The per-role statistics of a GRPO update (``rl.grpo_loss.policy_loss``), and the adapter's gradient norm.
LOSS_STATS = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "ratio_max", "adv_mean", "n_forwarded", "n_tokens",
              "pad_frac", "logp_drift_mean", "logp_drift_p99", "ratio_outside_clip", "tis_weight_mean", "grad_norm",
              "<stat>")
#: The stage seconds of a step (``stage_clock``).
TIME_COLUMNS = ("sync_s", "rollout_s", "reward_s", "group_s", "update_s", "validate_s", "step_s")
_UNSPACED = ("step", "method")


def _namespaced(name: str) -> str:
    """A step-record column under its namespace (:data:`METRIC_NAMESPACES`), from the flat name the
    records carried before (``agent_reward`` -> ``rollout/agent_reward``, ``ranker_entropy`` ->
    ``ranker/entropy``, ``agent_kl`` -> ``loss/agent_kl``, ``rollout_s`` -> ``time/rollout_s``,
    ``val_f1`` -> ``val/f1``); a name with a namespace, ``step`` and ``method`` are returned as they are.
    Glossary patterns (``<role>_kl``) map the same way. The relevance training's columns too:
    its sampled rankings under ``ranker/``, its update's gradient norm ``loss/ranker_grad_norm``."""
    if "/" in name or name in _UNSPACED:
        return name
    if name.startswith("val_"):
        return f"val/{name[4:]}"
    if name in TIME_COLUMNS:
        return f"time/{name}"
    head, _, tail = name.partition("_")
    per_policy = head in (*STAT_PREFIXES, "<role>", "<adapter>")
    if per_policy and tail == "update_s":
        return f"time/{name}"
    if name == "grad_norm":  # the relevance training's: it updates the ranker's adapter
        return "loss/ranker_grad_norm"
    if per_policy and tail in LOSS_STATS:
        return f"loss/{name}"
    if head == "agent" or name in ("n_questions", "n_trajectories", "searches_per_traj"):
        return f"rollout/{name}"
    if name == "n_ranker_calls":
        return "ranker/n_calls"
    return f"ranker/{name.removeprefix('ranker_')}"


#: Every column of the per-step records (``steps.csv``), for the README glossary. ``<role>`` is
#: agent or ranker (the policy updated), ``<adapter>`` agent, ranker, shared or scorer (the scoring
#: ranker of a scoring ``training.ranker_kind``, whose GRPO stats read ``ranker_*``).
_FLAT_STEP_GLOSSARY: dict[str, str] = {
    "step": "0-based training step; -1: the validation before the first update (TrainConfig.validate_at_start), "
            "a row with only step, method and the val_* columns",
    "method": "training method (config.methods.TRAINING_METHODS)",
    "n_questions": "questions rolled out this step", "n_trajectories": "trajectories (questions x G)",
    "agent_reward": "mean agent reward, Eq. 4 (F1 if the protocol was kept, else -alpha)",
    "agent_f1": "mean answer F1 of the trajectories (0 without a valid answer)",
    "agent_best_of_g_f1": "mean over the step's questions of the best answer F1 among its G trajectories (pass@G in F1; "
                          "beside agent_f1, the mean of G: how much better a group's best sample is than its average, "
                          "what GRPO has to work with)",
    "agent_groups_without_signal": "share of the step's questions whose G agent rewards are all equal: zero advantage, "
                                   "no policy gradient from that question (with a KL term, that term's alone)",
    "agent_entropy": "the agent's per-token entropy, estimated as the mean -log p of its sampled tokens (the generation "
                     "backend's log-probs, of the untempered logits: in expectation the entropy at temperature 1, a "
                     "cross-entropy against the tempered samples below it); falling: the policy sharpens",
    "agent_format_ok": "share of trajectories that kept the protocol on every turn and answered",
    "searches_per_traj": "mean searches run per trajectory",
    "agent_generated_tokens": "mean tokens the agent generated per trajectory, over all its turns (the rollout's decode "
                              "work; with agent_context_tokens, what `cosearch plan` is checked against)",
    "agent_context_tokens": "mean final length of a trajectory in tokens: prompt, turns and the passages read (what "
                            "the update forwards per sequence)",
    "agent_prompt_tokens": "mean length of a trajectory's first prompt in tokens (instructions and question: what its G "
                           "samples share)",
    "n_ranker_calls": "search calls this step (one ranking each)",
    "ranker_entropy": "the ranker's agent_entropy: mean -log p of its sampled output tokens (the LLM judge's: of its "
                      "sampled picks); NaN for a rule ranker, which samples nothing",
    "ranker_valid_rate": "share of ranker outputs that followed the protocol (rule rankers: 1)",
    "hit@K": "share of search calls whose K passages shown to the agent hold an answer passage (Hit@K of the "
             "ranking; at the paper's K = 5, the Hit@5 of its Fig. 2b)",
    "i_ans_rate": "share of search calls whose N candidates held an answer passage (I_ans = 1)",
    "r_rel_pre": "mean relevance reward over all search calls (before grouping filters)",
    "r_rel_post": "mean relevance reward over the calls in surviving ranker groups",
    "ranker_reward_pre": "mean composite ranker reward over kept calls (before grouping filters)",
    "ranker_reward_post": "mean composite ranker reward over the calls in surviving groups",
    "ranker_main_pre": "mean r_main (agent term of the composite) over kept calls",
    "ranker_main_post": "mean r_main over the calls in surviving groups",
    "grouping_<stat>": "semantic-grouping statistics of the step (rl.semantic_grouping.GROUPING_GLOSSARY)",
    "<role>_loss": "GRPO loss of the role's update (surrogate + KL), token-weighted over micro-batches",
    "<role>_pg_loss": "the clipped-surrogate part of the loss",
    "<role>_kl": "token-mean k3 KL to the reference (training.grpo.kl_reference: the base model, adapters off, or the adapter's start)",
    "<role>_clip_frac": "share of tokens whose gradient the clip zeroed",
    "<role>_ratio_mean": "mean importance ratio exp(logp - old logp) over tokens",
    "<role>_ratio_max": "largest importance ratio",
    "<role>_adv_mean": "mean advantage of the forwarded sequences",
    "<role>_n_forwarded": "sequences forwarded (non-zero advantage; every one with a KL term)",
    "<role>_n_tokens": "scored tokens in the forwarded sequences",
    "<role>_pad_frac": "padding positions / all token positions forwarded in the role's micro-batches "
                       "(TrainConfig.length_grouped_micro_batches lowers it); a speed figure: it depends on how "
                       "the sequences fall into micro-batches and, data parallel, into ranks",
    "<role>_logp_drift_mean": "mean |trainer logp - rollout logp| over the scored tokens of the first minibatch, "
                              "before any optimizer step: how far the generation backend's sampling log-probs are "
                              "from the trainer's forward (~0 in float32 on CPU with the transformers backend; vLLM in "
                              "bf16: ~0.04 measured on CPU)",
    "<role>_logp_drift_p99": "99th percentile of that |delta logp|",
    "<role>_ratio_outside_clip": "share of the first minibatch's importance ratios outside [1 - eps, 1 + eps_high] "
                                 "before any optimizer step: clipping that acts on numerical noise (0 when "
                                 "grpo.old_logprobs recomputes them)",
    "<role>_tis_weight_mean": "mean truncated importance weight min(pi_trainer / pi_rollout, grpo.tis_cap) (TIS on)",
    "<adapter>_grad_norm": "adapter gradient norm before clipping (mean over minibatches)",
    "<adapter>_update_s": "seconds spent updating the adapter",
    "sync_s": "seconds spent saving the updated adapters and re-registering them with vLLM (vLLM backend only)",
    "rollout_s": "seconds of the rollout stage (generation, retrieval, ranking)",
    "reward_s": "seconds of the rewards stage (Eq. 4 per trajectory, Eq. 6 per ranker call; the judge's labels)",
    "group_s": "seconds of the group stage (agent groups by question, semantic ranker groups, advantages)",
    "update_s": "seconds of the update stage (every adapter's GRPO update)",
    "validate_s": "seconds of the validation after the step (at the steps of val_f1)",
    "step_s": "seconds of the step's stages from rollout to sync (validation excluded)",
    "rollout/bf16": "1 when the step's training rollouts ran under CPU bf16 autocast (training.autocast; their turns "
                    "decoded on bf16 copies of the weights where training.autocast.bf16_weights is set), 0 in float32; "
                    "only in runs that set training.autocast",
    "loss/bf16": "1 when the step's GRPO update ran under CPU bf16 autocast (training.autocast), 0 in float32; only in "
                 "runs that set training.autocast",
    "val_f1": "greedy avg F1 on the validation questions (every eval_every steps, after the last, and at step -1)",
    "val_ranker_hit@<k>": "Hit@k of the K passages the method's greedy ranking shows (retriever top-K for search_r1, "
                          "Eq. 7 for oracle), mean over the held-out sub-queries of the validation questions (their "
                          "gold-chain hops, relevance: the hop's answer; the question itself without a chain); "
                          "at the steps of val_f1; one column per cutoff k below K of training.ranker_reward.hit_ks",
    "val_ranker_hit@K": "Hit@K of the same lists: whether any of the K passages shown holds the answer",
    "val_ranker_valid_rate": "share of the held-out rankings that followed the protocol (rule rankings: 1)",
}


#: Every column of a relevance-training run's ``steps.csv`` (``rl.relevance_training``: the Fixed
#: Ranker's ranker-only GRPO). Its ``validation.csv`` has the VALIDATION_GLOSSARY columns, method ``relevance``.
_FLAT_RELEVANCE_STEP_GLOSSARY: dict[str, str] = {
    "step": "0-based step; -1: the greedy validation before the first update (only step and the val_* columns)",
    "n_prompts": "sub-queries ranked this step (each one GRPO group)",
    "n_samples": "sampled rankings (prompts x G)",
    "reward": "mean reward of the sampled rankings: r_rel of the K passages shown, the invalid penalty for a broken output",
    "hit@<k>": "mean Hit@k of the K passages the sampled rankings show (the retriever's top-K for an invalid output), "
               "per cutoff k below K of relevance.hit_ks",
    "hit@K": "mean Hit@K of the same lists (any of the K passages holds the answer)",
    "valid_rate": "share of sampled rankings that followed the protocol",
    "groups_with_signal": "groups whose G rewards are not all equal (the others get zero advantage: no policy gradient; a KL term's alone)",
    "output_tokens": "mean generated tokens per ranking",
    "ranker_<stat>": "the update's GRPO statistics (as <role>_<stat> of the joint step records)",
    "grad_norm": "ranker adapter gradient norm before clipping",
    "rollout_s": "seconds sampling the rankings", "reward_s": "seconds of the rewards and advantages",
    "update_s": "seconds of the GRPO update", "validate_s": "seconds of the validation after the step",
    "step_s": "seconds of rollout, reward and update",
    "val_ranker_hit@<k>": "greedy Hit@k on the held-out sub-queries (every eval_every steps, after the last, and at "
                          "step -1), per cutoff k below K of relevance.hit_ks",
    "val_ranker_hit@K": "greedy Hit@K on the held-out sub-queries, at the same steps",
    "val_ranker_valid_rate": "share of the greedy held-out rankings that followed the protocol",
}


STEP_GLOSSARY: dict[str, str] = {_namespaced(k): v for k, v in _FLAT_STEP_GLOSSARY.items()}
RELEVANCE_STEP_GLOSSARY: dict[str, str] = {_namespaced(k): v for k, v in _FLAT_RELEVANCE_STEP_GLOSSARY.items()}


@functools.lru_cache(maxsize=4096)  # every record of every step goes through it, key by key
def step_metric_name(name: str) -> str:
    """Today's name of a step-record column: under its namespace (:data:`METRIC_NAMESPACES`) when the
    flat name the records carried before is a documented step or relevance-step column
    (``agent_reward`` -> ``rollout/agent_reward``, ``ranker_entropy`` -> ``ranker/entropy``,
    ``agent_kl`` -> ``loss/agent_kl``, ``rollout_s`` -> ``time/rollout_s``, ``val_f1`` -> ``val/f1``,
    the relevance training's ``reward`` -> ``ranker/reward``); any other name as it is, so a table's
    other columns (``method``, a summary's ``part``) pass through."""
    spaced = _namespaced(name)
    if spaced == name:
        return name
    for glossary in (STEP_GLOSSARY, RELEVANCE_STEP_GLOSSARY):
        try:
            describe_step_metric(spaced, glossary)
            return spaced
        except KeyError:
            pass
    return name


#: Columns of ``validation.csv``: one row per validation item (a validation question or a held-out
#: sub-query) and validation; what notebook 03's paired intervals on the validation curves resample.
VALIDATION_GLOSSARY: dict[str, str] = {
    "step": "the step record whose val_* columns these rows make up (0-based step; -1: before the first update)",
    "method": "training method (config.methods.TRAINING_METHODS)",
    "kind": "agent: one validation question through the agent loop (f1); ranker: one held-out sub-query ranked "
            "alone (hit@k, valid)",
    "question_id": "the validation question (agent rows) or <question_id>/hop<h> (ranker rows: the gold chain's hop; "
                   "/question when the question text stands in)",
    "dataset": "the question's family; the bootstrap resamples within it",
    "f1": "agent rows: greedy answer F1 of the question (val_f1 is their macro average over families)",
    "hit@<k>": "ranker rows: Hit@k of the K passages the method's greedy ranking shows (val_ranker_hit@<k> is "
               "their mean), per cutoff k below K of the hit_ks",
    "hit@K": "ranker rows: Hit@K of the same list (val_ranker_hit@K is their mean)",
    "valid": "ranker rows: 1 when the ranking followed the protocol (rule rankings: always)",
}
#: The validation columns of a run with the paper's cutoffs at K <= 3 (``hit@1``, ``hit@K``): an
#: empty table's; a run's own are :func:`validation_columns` of its hit names.
VALIDATION_COLUMNS = tuple(expand_hit_patterns(list(VALIDATION_GLOSSARY), ["hit@1", HIT_WHOLE_LIST]))


def validation_columns(present: Sequence[str]) -> list[str]:
    """``validation.csv``'s columns in glossary order, with the Hit columns ``present`` holds."""
    return expand_hit_patterns(list(VALIDATION_GLOSSARY), hit_columns_in(present) or ["hit@1", HIT_WHOLE_LIST])


def hit_columns_in(columns: Sequence[str], prefix: str = "") -> list[str]:
    """The Hit names (without ``prefix``) of the ``<prefix>hit@<k>`` and ``<prefix>hit@K`` columns
    among ``columns``: cutoffs in increasing order, then ``hit@K``."""
    names = [c[len(prefix):] for c in columns if c.startswith(f"{prefix}hit@")]
    cutoffs = sorted((n for n in names if n[4:].isdigit()), key=lambda n: int(n[4:]))
    return cutoffs + [n for n in names if n == HIT_WHOLE_LIST]

#: Where a scoring ranker (config.RANKER_KINDS: the cross-encoder, the LLM judge) travels, whatever
#: its model: the adapters' key (``{"agent": ..., "scorer": ...}``), a checkpoint's state key and
#: folder (``adapters/scorer/``), its optimizer stats' prefix (``scorer_grad_norm``).
SCORER_SLOT = "scorer"

#: Names renamed since some records and checkpoints were written: {old name: new name}. The scoring
#: ranker's slot was named for the first kind that filled it, the cross-encoder.
RENAMED_SLOTS = {"cross_encoder": SCORER_SLOT}
#: Harness methods renamed since some evaluation records were written (their ``method`` values).
RENAMED_EVAL_METHODS = {"agent_cross_encoder": "agent_scorer"}
#: Harness settings (``eval.harness.HarnessConfig`` fields) renamed since some evaluations were keyed.
RENAMED_HARNESS_FIELDS = {"cross_encoder_model": "scorer_model"}
#: The prefixes of Hit columns (step, call, relevance and validation records; evaluation records;
#: the step records' validation) that were named for the paper's cutoffs {1, 3, 5} before they were
#: named for K (``metrics.hit_label``). Every run written then had K <= 5, so ``hit@5`` was Hit@K;
#: ``hit@3`` was Hit@K too where K <= 3, and is dropped on reading where it equals ``hit@K`` in every row.
OLD_HIT_PREFIXES = ("", "ranker_", "val_ranker_")
#: Step and call columns renamed since some records were written: {old name: new name}.
RENAMED_STEP_COLUMNS = {**{f"{p}hit@5": f"{p}{HIT_WHOLE_LIST}" for p in OLD_HIT_PREFIXES},
                        **{f"{old}_{stat}": f"{new}_{stat}" for old, new in RENAMED_SLOTS.items()
                           for stat in ("grad_norm", "update_s")}}


def _same_values(a: Any, b: Any) -> bool:
    """Whether two columns (pandas Series) or values hold the same values, missing ones included."""
    if hasattr(a, "isna"):
        return bool(((a == b) | (a.isna() & b.isna())).all())
    return a == b or (a != a and b != b)  # NaN != NaN


def _old_hit3_columns(table: Any) -> list[str]:
    """The old ``<prefix>hit@3`` columns of a renamed table that measured the whole list (equal to
    ``<prefix>hit@K`` everywhere: K <= 3); see :data:`OLD_HIT_PREFIXES`."""
    return [f"{p}hit@3" for p in OLD_HIT_PREFIXES
            if f"{p}hit@3" in table and f"{p}{HIT_WHOLE_LIST}" in table
            and _same_values(table[f"{p}hit@3"], table[f"{p}{HIT_WHOLE_LIST}"])]


def renamed_slots(state: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's state, or {slot: folder} of its adapters, under today's slot names (:data:`RENAMED_SLOTS`)."""
    return {RENAMED_SLOTS.get(name, name): value for name, value in state.items()}


def under_current_names(table: Any) -> Any:
    """A records table (a pandas DataFrame: step, call or evaluation records, read back) under today's
    names: its columns renamed since it was written (:data:`RENAMED_STEP_COLUMNS`) and the harness
    methods in its ``method`` and ``eval_method`` columns (:data:`RENAMED_EVAL_METHODS`). Every reader
    of committed or resumed records goes through it."""
    renamed = [old for old in RENAMED_STEP_COLUMNS if old in table]
    table = table.rename(columns=RENAMED_STEP_COLUMNS)
    if any(old.endswith("hit@5") for old in renamed):
        table = table.drop(columns=_old_hit3_columns(table))
    for column in ("method", "eval_method"):  # the harness method, or a label and the harness method under it
        if column in table:
            table[column] = table[column].replace(RENAMED_EVAL_METHODS)
    return table


def current_step_columns(record: Mapping[str, Any]) -> dict[str, Any]:
    """A step or call record (a dict) under today's column names (:data:`RENAMED_STEP_COLUMNS`; an old
    ``hit@3`` equal to its ``hit@K`` is dropped, as :func:`under_current_names` does per table)."""
    renamed = {RENAMED_STEP_COLUMNS.get(name, name): value for name, value in record.items()}
    if any(name.endswith("hit@5") for name in record):
        for name in _old_hit3_columns(renamed):
            del renamed[name]
    return renamed


def hit_pattern_of(name: str) -> str | None:
    """The glossary pattern of a Hit column with a numeric cutoff (``val_ranker_hit@3`` ->
    ``val_ranker_hit@<k>``); None for any other name."""
    head, sep, cutoff = name.rpartition("hit@")
    return f"{head}{HIT_PATTERN}" if sep and cutoff.isdigit() else None


def step_table_under_current_names(table: Any) -> Any:
    """A step-records table (``steps.csv``, read back) under today's names: :func:`under_current_names`,
    then every flat column under its namespace (:func:`step_metric_name`)."""
    table = under_current_names(table)
    return table.rename(columns={c: step_metric_name(c) for c in table.columns})


def current_step_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A step record (a dict: a checkpoint's, a metrics file's row) under today's names:
    :func:`current_step_columns`, then every flat key under its namespace (:func:`step_metric_name`)."""
    return {step_metric_name(k): v for k, v in current_step_columns(record).items()}


def namespaced_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A step record as a trainer assembles it (flat names from its stages) under the namespaced
    names it is written with (:func:`step_metric_name`)."""
    return {step_metric_name(k): v for k, v in record.items()}


def describe_step_metric(name: str, glossary: Mapping[str, str] | None = None) -> str:
    """The entry of a step-record column (today's name, patterns included) in ``glossary`` (default
    :data:`STEP_GLOSSARY`); KeyError when undocumented."""
    glossary = STEP_GLOSSARY if glossary is None else glossary
    if name in glossary:
        return glossary[name]
    if hit_pattern_of(name) in glossary:
        return glossary[hit_pattern_of(name)]
    space, _, rest = name.rpartition("/")
    if rest.startswith("grouping_") and f"{space}/grouping_<stat>" in glossary:
        return glossary[f"{space}/grouping_<stat>"]
    head, _, tail = rest.partition("_")
    if head in STAT_PREFIXES:
        for pattern in (f"{space}/<role>_{tail}", f"{space}/<adapter>_{tail}", f"{space}/{head}_<stat>"):
            if pattern in glossary:
                return glossary[pattern]
    raise KeyError(f"step metric {name!r} has no glossary entry")


# --------------------------------------------------------------------------- checkpoints


def checkpoint_name(step: int) -> str:
    """``step_000003``: the folder of the checkpoint taken after ``step`` steps."""
    return f"step_{step:06d}"


def rollout_stage_name(step: int) -> str:
    """``rollouts_step_000003.pt``: the scored rollouts of the step that starts after ``step`` steps,
    written at the stage boundary before its update (``rl.run_protocol.TrainingRun.save_stage``)."""
    return f"rollouts_{checkpoint_name(step)}.pt"


def checkpoint_folders(out_dir: str | Path) -> list[Path]:
    """The checkpoint folders of a run, oldest first (folders still being written, ``*.tmp``, left out)."""
    return sorted(p for p in (Path(out_dir) / CHECKPOINTS_DIR).glob("step_*") if not p.name.endswith(".tmp"))


#: The file a checkpoint folder lists its files in (size and SHA-256 each), written last.
CHECKPOINT_MANIFEST = "MANIFEST.json"


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checkpoint_manifest(folder: Path) -> Path:
    """List every file of a checkpoint folder with its size and SHA-256 (``MANIFEST.json``)."""
    files = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CHECKPOINT_MANIFEST}
    path = folder / CHECKPOINT_MANIFEST
    path.write_text(json.dumps(files, indent=1))
    return path


def checkpoint_problem(folder: str | Path) -> str | None:
    """None when the checkpoint is whole, else what is wrong with it: no ``state.pt``, or a file
    missing, truncated or changed against its manifest. Checkpoints written before manifests existed
    are checked for ``state.pt`` only."""
    folder = Path(folder)
    if not (folder / "state.pt").exists():
        return "no state.pt"
    manifest = folder / CHECKPOINT_MANIFEST
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{CHECKPOINT_MANIFEST} unreadable"
    for name, want in files.items():
        path = folder / name
        if not path.exists():
            return f"{name} missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']} (truncated?)"
        if file_sha256(path) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupted)"
    return None


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest whole checkpoint of ``out_dir``. A newer one that is damaged
    (:func:`checkpoint_problem`) is skipped with a warning naming it and what is wrong."""
    done = checkpoint_folders(out_dir)
    for path in reversed(done):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        warnings.warn(f"checkpoint {path} skipped: {problem}; trying the one before it", RuntimeWarning, stacklevel=2)
    return None


#: What a training run writes into its folder (removed by :func:`clear_run`).
RUN_OUTPUTS = (CHECKPOINTS_DIR, STEPS_FILE, RANKER_CALLS_FILE, VALIDATION_FILE, LIVE_ADAPTERS_DIR, TRACKER_DIR)


def clear_run(out_dir: str | Path) -> None:
    """Delete a training folder's checkpoints and records (nothing else in it)."""
    for name in RUN_OUTPUTS:
        path = Path(out_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
