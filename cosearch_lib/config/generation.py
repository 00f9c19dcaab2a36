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

#: Backends :func:`load_policy_model` can train with ("vllm" alone only generates).
TRAIN_BACKENDS = ("transformers", "unsloth")


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
class ModelsConfig:
    agent: str = "smollm2-135m-instruct"  # agent policy: bundled name, local folder or hub id
    ranker: str = "smollm2-135m-instruct"  # generative ranker policy (the same name shares one loaded base)
    backend: str = "transformers"  # generation backend: "transformers" (CPU/GPU), "vllm" or "unsloth" (GPU)
    batch_size: int = 8  # prompts per forward pass of the transformers backend
    compile_decode: bool | None = field(default=None, metadata=SPEED_ONLY)  # transformers backend: compiled decode step on a static cache (None: on a GPU only)

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
