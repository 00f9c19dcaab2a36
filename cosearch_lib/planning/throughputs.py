"""The measured throughputs the job planner multiplies a workload by, each with the record it comes from.

* **GPUs**: one H100 80 GB, bf16, random weights of the real architectures (cost does not depend on
  the weights), measured for issue 10 and written in ``docs/GPU_COSTS.md``. Where a shape was
  not measured, its rate is the nearest measured shape's scaled by parameter count (marked
  ``derived``). Other GPU kinds have their memory from the vendor's specification and the H100's
  rates (marked: not measured on that kind).
* **CPUs**: this machine's own measurement, ``benchmarks/cpu_throughput.py``, whose output is
  committed as ``benchmarks/records/cpu_throughput.json`` (read by :func:`cpu_rates`).

A decode step of ``b`` rows at mean context ``c`` costs ``step_s + b * (row_s + c * row_context_s)``
seconds (one forward of the batch's next tokens, each row reading its cache): on a GPU the step cost
barely grows with the rows (memory-bound), on a CPU it does, and with the context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from cosearch_lib.config import ConfigError
from cosearch_lib.paths import project_root
from cosearch_lib.planning.model_shapes import ModelShape

GPU_COSTS = "docs/GPU_COSTS.md"
CPU_RECORD = "benchmarks/records/cpu_throughput.json"


@dataclass(frozen=True)
class Measured:
    """One figure and where it comes from (``derived``: computed from measured ones, said how)."""

    value: float
    source: str
    derived: bool = False


@dataclass(frozen=True)
class ShapeRates:
    """One policy shape on one device: decode step cost, tokens/s of a forward pass over a prompt
    (prefill, the reference and old-log-prob passes) and of a training pass (forward + backward)."""

    decode_step_s: Measured  # seconds of one decode step, whatever the rows (the fixed part)
    decode_row_s: Measured  # seconds per row of one decode step
    prefill_tps: Measured
    train_tps: Measured
    # seconds per row per token of context of one decode step (each row reads its cache); 0: not measured
    decode_row_context_s: Measured = Measured(0.0, "not measured (the context's cost taken as part of the rows')", derived=True)
    # an LLM judge's batched short prompts (one per candidate), forward and forward + backward; None: prefill and train rates
    judge_tps: Measured | None = None
    judge_train_tps: Measured | None = None

    @property
    def scoring_tps(self) -> Measured:
        return self.judge_tps or self.prefill_tps

    @property
    def scoring_train_tps(self) -> Measured:
        return self.judge_train_tps or self.train_tps

    def decode_seconds(self, steps: float, rows: float, context: float = 0.0) -> float:
        """Seconds of ``steps`` decode steps of ``rows`` rows whose contexts hold ``context`` tokens (mean)."""
        return steps * (self.decode_step_s.value + rows * (self.decode_row_s.value + context * self.decode_row_context_s.value))

    def row_token_s(self, context: float = 0.0) -> float:
        """What one row adds to a decode step at ``context`` tokens: a generated token's own cost."""
        return self.decode_row_s.value + context * self.decode_row_context_s.value

    def in_bf16(self, factors: dict[str, Measured]) -> ShapeRates:
        """These rates under CPU bf16 autocast: each kind of work sped up by its measured factor
        (:data:`BF16_FACTORS`; a kind not measured stays as it is)."""
        def cost(m: Measured, kind: str) -> Measured:
            f = factors.get(kind)
            return m if f is None else Measured(m.value / f.value, f"{m.source}; / {f.value:.2f} under bf16 ({f.source})", derived=True)

        def rate(m: Measured | None, kind: str) -> Measured | None:
            f = factors.get(kind)
            return m if m is None or f is None else Measured(m.value * f.value, f"{m.source}; x {f.value:.2f} under bf16 ({f.source})",
                                                             derived=True)
        # the judge's work at its own factors, from the float32 prompt rates where its own were not measured
        judge = rate(self.judge_tps or (self.prefill_tps if "judge" in factors else None), "judge")
        judge_train = rate(self.judge_train_tps or (self.train_tps if "judge_train" in factors else None), "judge_train")
        return ShapeRates(cost(self.decode_step_s, "decode"), cost(self.decode_row_s, "decode"), rate(self.prefill_tps, "prefill"),
                          rate(self.train_tps, "train"), cost(self.decode_row_context_s, "decode"), judge, judge_train)

    def scaled(self, factor: float, why: str) -> ShapeRates:
        """These rates for a model ``factor`` times as large (costs x factor, rates / factor)."""
        def cost(m: Measured) -> Measured:
            return Measured(m.value * factor, f"{m.source}; {why}", derived=True)

        def rate(m: Measured) -> Measured:
            return Measured(m.value / factor, f"{m.source}; {why}", derived=True)
        return ShapeRates(cost(self.decode_step_s), cost(self.decode_row_s), rate(self.prefill_tps), rate(self.train_tps),
                          cost(self.decode_row_context_s), self.judge_tps and rate(self.judge_tps),
                          self.judge_train_tps and rate(self.judge_train_tps))


@dataclass(frozen=True)
class DeviceRates:
    """Everything the planner needs of one kind of device."""

    name: str
    memory_gib: float | None  # a GPU's memory (None: a CPU rank, host memory)
    policies: dict[str, ShapeRates]  # by ModelShape.name
    encoder_tps: Measured  # encoder tokens/s (query encoding, index building)
    search_vectors_per_s: Measured  # flat inner-product search: index vectors x queries scanned per second (768-d)
    note: str = ""
    extra: dict[str, Measured] = field(default_factory=dict)
    # a CPU's speed-up under bf16 autocast per kind of work (BF16_FACTORS), measured against float32 side by
    # side on a CPU with bf16 instructions; empty: not measured (a GPU's policies are bf16 in its rates already)
    bf16: dict[str, Measured] = field(default_factory=dict)

    def policy(self, shape: ModelShape, *, bf16: bool = False) -> ShapeRates:
        """The rates of ``shape``: measured, or the nearest measured shape's scaled by parameters; with
        ``bf16``, under CPU bf16 autocast (:attr:`bf16`'s factors)."""
        rates = self._policy(shape)
        return rates.in_bf16(self.bf16) if bf16 else rates

    def _policy(self, shape: ModelShape) -> ShapeRates:
        if shape.name in self.policies:
            return self.policies[shape.name]
        if not self.policies:
            raise ConfigError(f"no policy throughput measured on {self.name}")
        params = {name: _PARAMS[name] for name in self.policies}
        nearest = min(params, key=lambda n: abs(params[n] - shape.parameters))
        factor = shape.parameters / params[nearest]
        return self.policies[nearest].scaled(factor, f"scaled from {nearest} by parameters (x{factor:.2f})")


#: The kinds of work whose bf16 speed-up ``benchmarks/cpu_throughput.py --bf16`` measures: the decode step,
#: a prompt's forward pass, the GRPO update, the LLM judge's scoring and its update.
BF16_FACTORS = ("decode", "prefill", "train", "judge", "judge_train")

#: Parameters of the measured shapes (for scaling), by ModelShape.name.
_PARAMS = {"Qwen2.5-7B": 7.616e9, "Qwen2.5-3B": 3.086e9, "SmolLM2-135M": 1.345e8}


def _h100() -> DeviceRates:
    src = f"{GPU_COSTS}, one H100 80 GB, bf16"
    seven = ShapeRates(
        decode_step_s=Measured(256 / 2646.0, f"{src}: 7B model.generate, static cache, batch 256: 2,646 tokens/s"),
        decode_row_s=Measured(0.0, "memory-bound decode: the step cost taken as independent of the rows (one batch size measured)", derived=True),
        prefill_tps=Measured(4 * 32 * 1500 / 10.5, f"{src}: 4 x the 7B training rate (a backward ~2 forwards, checkpointing recomputes one)", derived=True),
        train_tps=Measured(32 * 1500 / 10.5, f"{src}: 7B grpo_update, 32 x 1,500 tokens, gradient checkpointing, 10.5 s"))
    three = ShapeRates(
        decode_step_s=Measured(64 / 1555.0, f"{src}: 3B model.generate, dynamic cache, batch 64: 1,555 tokens/s"),
        decode_row_s=Measured(0.0, "memory-bound decode: the step cost taken as independent of the rows (one batch size measured)", derived=True),
        prefill_tps=Measured(4 * 64 * 1500 / 9.8, f"{src}: 4 x the 3B training rate", derived=True),
        train_tps=Measured(64 * 1500 / 9.8, f"{src}: 3B grpo_update, 64 x 1,500 tokens, micro-batch 4, 9.8 s"))
    small = ShapeRates(
        # static cache: 9,374 tokens/s at 64 rows, 14,863 at 256: step = a + b x rows through both points
        decode_step_s=Measured((64 / 9374 * 256 - 256 / 14863 * 64) / (256 - 64), f"{src}: 135M model.generate, static cache, batch 64 and 256 (9,374 and 14,863 tokens/s)"),
        decode_row_s=Measured((256 / 14863 - 64 / 9374) / (256 - 64), f"{src}: 135M model.generate, static cache, batch 64 and 256"),
        prefill_tps=Measured(4 * 64 * 1500 / 4.8, f"{src}: 4 x the 135M training rate", derived=True),
        train_tps=Measured(64 * 1500 / 4.8, f"{src}: 135M grpo_update, 64 x 1,500 tokens, micro-batch 4, 4.8 s"))
    return DeviceRates(
        "H100 80GB", 79.6, {"Qwen2.5-7B": seven, "Qwen2.5-3B": three, "SmolLM2-135M": small},
        encoder_tps=Measured(16465 * 128.0, f"{src}: e5-base shape, fp16, 128-token passages, batch 512: 16,465 passages/s"),
        # 1M x 768 fp16 top-50, batch 64: 1.35 ms -> 64 queries x 1M vectors per 1.35 ms
        search_vectors_per_s=Measured(64 * 1e6 / 1.35e-3, f"{src}: flat inner product, torch, 1M x 768 fp16, batch 64, 1.35 ms"))


#: GPU kinds ``cosearch plan --gpu`` knows: memory (GiB the device reports) and whose rates it takes.
GPU_MEMORY_GIB = {"h100": 79.6, "h200": 139.8, "a100-80gb": 79.2, "a100-40gb": 39.4}


def gpu_rates(kind: str = "h100") -> DeviceRates:
    """The rates of a GPU kind (:data:`GPU_MEMORY_GIB`); only the H100 was measured."""
    key = kind.lower()
    if key not in GPU_MEMORY_GIB:
        raise ConfigError(f"--gpu {kind!r}: expected one of {', '.join(GPU_MEMORY_GIB)}")
    rates = _h100()
    if key == "h100":
        return rates
    return replace(rates, name=key.upper(), memory_gib=GPU_MEMORY_GIB[key],
                   note=f"{key.upper()}: memory from its specification; times are the H100's (not measured on this kind)")


def cpu_rates(threads: int = 2, path: str | Path | None = None) -> DeviceRates:
    """This machine's CPU rates at ``threads`` torch threads (the nearest measured count):
    ``benchmarks/records/cpu_throughput.json``, written by ``benchmarks/cpu_throughput.py``."""
    file = Path(path) if path is not None else project_root() / CPU_RECORD
    try:
        record = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no CPU throughput record at {file}: run python benchmarks/cpu_throughput.py") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file} is not valid JSON ({err}): run python benchmarks/cpu_throughput.py again") from None
    return cpu_rates_of(record, threads, file)


def cpu_rates_of(record: dict, threads: int = 2, file: str | Path = CPU_RECORD) -> DeviceRates:
    """:func:`cpu_rates` of a record already read (``file``: where it came from, for the errors)."""
    try:
        by_threads = {int(k): v for k, v in record["by_threads"].items()}
        measured = min(by_threads, key=lambda n: (abs(n - threads), -n))
        where = f"{CPU_RECORD} ({record.get('cpu', 'CPU')}, {measured} thread(s), {str(record.get('git_sha', '?'))[:7]})"
        record = by_threads[measured]
        policies = {name: ShapeRates(
            decode_step_s=Measured(r["decode_step_s"], f"{where}: decode steps at {r['decode_rows']} rows, fit"),
            decode_row_s=Measured(r["decode_row_s"], f"{where}: decode steps at {r['decode_rows']} rows, fit"),
            prefill_tps=Measured(r["prefill_tps"], f"{where}: prompt forward passes"),
            train_tps=Measured(r["train_tps"], f"{where}: GRPO update, forward + backward"),
            decode_row_context_s=Measured(r.get("decode_row_context_s", 0.0),
                                          f"{where}: decode steps at {r.get('decode_points', 'one prompt length')} (rows, context), fit"),
            judge_tps=Measured(r["judge_tps"], f"{where}: LLM judge, a search's candidates scored in one batch") if "judge_tps" in r else None,
            judge_train_tps=Measured(r["judge_train_tps"], f"{where}: LLM judge, forward + backward of the margins")
            if "judge_train_tps" in r else None)
            for name, r in record["policies"].items()}
        bf16 = record.get("bf16") or {}
        bf16_where = (f"cpu_throughput.py --bf16 on {bf16.get('cpu', 'a CPU')} with {bf16.get('instructions', '?')}, "
                      f"{measured} thread(s), {str(bf16.get('git_sha', '?'))[:7]}")
        return DeviceRates(f"CPU, {measured} thread(s)", None, policies,
                           encoder_tps=Measured(record["encoder_tps"], f"{where}: encoder forward passes"),
                           search_vectors_per_s=Measured(record["search_vectors_per_s"], f"{where}: flat FAISS search"),
                           extra={k: Measured(v, f"{where}: {k}") for k, v in record.get("extra", {}).items()},
                           bf16={k: Measured(float(v), bf16_where) for k, v in bf16.get("factors", {}).items() if k in BF16_FACTORS})
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ConfigError(f"{file} lacks {err}: run python benchmarks/cpu_throughput.py again") from None
