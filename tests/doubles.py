"""Test doubles shared by the test modules: scripted backends, a fixed retriever, well-formed agent
turns, and a tiny random Llama with a scripted joint trainer around it.

Test modules import from here (and from ``fixture_files`` for files in the real artefacts'
formats), never from each other.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from cosearch_lib.config import (
    PAPER_RULES,
    GroupingConfig,
    LoraSettings,
    ProtocolConfig,
    RolloutConfig,
    SamplingConfig,
    SearchBudget,
    TrainConfig,
)
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.models.generation.adapters import adapter_context
from cosearch_lib.models.generation.contract import Generation, check_prompts
from cosearch_lib.models.generation.sampling import Finisher, eos_token_ids, text_decoder
from cosearch_lib.models.lora_policies import PolicySet, lora_model
from cosearch_lib.rl.policy_sequences import policy_token_logprobs
from cosearch_lib.rl.trainer import JointTrainer, TrainerInputs


class FixedRetriever:
    """Always the first ``topn`` passages of ``corpus`` in order, scores descending; records each
    call as ``(queries, topn)`` so tests can check batching."""

    def __init__(self, corpus):
        from cosearch_lib.data.passage import Passage

        self.corpus, self._passage = list(corpus), Passage
        self.rows = {p.id: p for p in self.corpus}
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries, topn):
        self.calls.append((list(queries), topn))
        return [[self._passage(p.id, p.contents, 1.0 - i / 10) for i, p in enumerate(self.corpus[:topn])] for _ in queries]

    def get(self, pid):
        """CorpusStore-style lookup (the widgets show titles through it)."""
        return self.rows[pid]


def search_turn(query: str, reason: str = "I need to look this up.") -> str:
    """A well-formed agent search turn."""
    return f'<reason>{reason}</reason>\n<tool_call>{json.dumps({"name": "search", "arguments": {"query": query}})}</tool_call>'


def answer_turn(answer: str, reason: str = "The passages say so.") -> str:
    """A well-formed agent answer turn."""
    return f"<reason>{reason}</reason>\n<answer>{answer}</answer>"


def token_logprob(token_id: int) -> float:
    """The log-prob a :class:`ScriptedBackend` without a model reports for a token: fixed per token
    id, between -0.5 and -3.5, so that a test can tell the tokens' log-probs apart and none is a
    constant stand-in."""
    return -0.5 - 3.0 * ((token_id * 7919) % 101) / 100


class ScriptedBackend:
    """Canned responses with the real eos / stop / length rules, for deterministic rollout tests.

    ``responses`` is a function ``(prompt_ids, row_key) -> text``, a mapping ``row_key -> text``,
    or an iterable of texts consumed in order across calls (a queue). Each text is tokenised whole,
    followed by eos (``append_eos``, as a model ending its turn), then streamed through the same
    rules as :class:`TransformersBackend`. Each kept token's log-prob is, with ``model``, the
    model's own teacher-forced one under the call's adapter at the sampling temperature (what an
    engine sampling from the trained model reports, so that a trainer may take them as its old
    log-probs); without, :func:`token_logprob`. Calls are recorded in ``calls`` as
    ``(prompts, sampling, adapter, row_keys)``.
    """

    def __init__(self, tokenizer: Any,
                 responses: Callable[[list[int], object], str] | Mapping[object, str] | Iterable[str],
                 *, model: Any = None, append_eos: bool = True) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.append_eos = append_eos
        self.eos_ids = eos_token_ids(tokenizer)
        self.decode = text_decoder(tokenizer)
        self.calls: list[tuple[list[list[int]], SamplingConfig, str | None, list[object] | None]] = []
        if callable(responses):
            self._respond = responses
        elif isinstance(responses, Mapping):
            table = dict(responses)

            def lookup(prompt: list[int], key: object) -> str:
                if key not in table:
                    raise KeyError(f"ScriptedBackend has no response for row key {key!r}")
                return table[key]

            self._respond = lookup
        else:
            queue = iter(list(responses))

            def pop(prompt: list[int], key: object) -> str:
                try:
                    return next(queue)
                except StopIteration:
                    raise RuntimeError("ScriptedBackend ran out of scripted responses") from None

            self._respond = pop

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, adapter: str | None = None,
                 row_keys: list[object] | None = None) -> list[Generation]:
        check_prompts(prompts)
        if row_keys is not None and len(row_keys) != len(prompts):
            raise ValueError(f"row_keys has {len(row_keys)} entries for {len(prompts)} prompts")
        self.calls.append(([list(p) for p in prompts], sampling, adapter, None if row_keys is None else list(row_keys)))
        keys = row_keys if row_keys is not None else list(range(len(prompts)))
        finisher = Finisher(self.decode, self.eos_ids, sampling)
        eos = self.tokenizer.eos_token_id
        results = []
        for prompt, key in zip(prompts, keys):
            stream = self.tokenizer.encode(self._respond(list(prompt), key), add_special_tokens=False)
            if self.append_eos:
                stream = [*stream, eos]
            ids: list[int] = []
            lps: list[float] = []
            reason = None
            for t in stream:
                reason = finisher.push(ids, lps, int(t), token_logprob(int(t)))
                if reason is not None:
                    break
            results.append(finisher.finish(ids, lps, reason or "length"))
        if self.model is not None:
            self._model_logprobs(prompts, results, sampling.temperature, adapter)
        return results

    def _model_logprobs(self, prompts: list[list[int]], results: list[Generation], temperature: float,
                        adapter: str | None) -> None:
        """Each generation's log-probs replaced by the model's teacher-forced ones under ``adapter``,
        at the sampling temperature (greedy: 1, as the contract says), computed as the trainer
        computes them (``rl.policy_sequences.policy_token_logprobs``, the LM head on the generated
        positions only)."""
        with torch.no_grad(), adapter_context(self.model, adapter):
            for i, gen in enumerate(results):
                if not gen.token_ids:
                    continue
                ids = torch.tensor([[*prompts[i], *gen.token_ids]])  # (1, L)
                mask = torch.zeros((1, ids.shape[1] - 1))  # (1, L-1): the predictions of the generated ids
                mask[0, len(prompts[i]) - 1:] = 1
                lp = policy_token_logprobs(self.model, ids, torch.ones_like(ids), temperature=temperature or 1.0, mask=mask)
                results[i] = dataclasses.replace(gen, logprobs=lp[0, len(prompts[i]) - 1:].tolist())


CORPUS = [Passage(str(i), f'"Doc {i}"\n{text}') for i, text in enumerate([
    "Drask is a river town.", "Orvane Tellis was born in Kessmere.", "Tellis wrote atlases.",
    "Unrelated passage about bells.", "The mill was built in 1843.", "A quiet harbour."])]
QUESTIONS = [
    QAExample(id="q1", question="Where was Orvane Tellis born?", golden_answers=["Kessmere"], data_source="syn_nq"),
    QAExample(id="q2", question="What did Tellis write?", golden_answers=["atlases"], data_source="syn_nq"),
    QAExample(id="q3", question="Which town is on the river?", golden_answers=["Drask"], data_source="syn_popqa"),
]
GOLD = {q.id: q.golden_answers[0] for q in QUESTIONS}
LORA = LoraSettings(r=4, alpha=8)


def tiny_model(tok, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return LlamaForCausalLM(config).eval()


def peaked_model(tok, seed: int = 0):
    """A 2-layer Llama with the SmolLM2 vocabulary; a wide init makes its logits peaked (a clear
    argmax, so greedy ids do not flip on float rounding)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.2, bos_token_id=1, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def script(prompt, key):
    """Turn 0 searches; turn 1 answers right for even samples and wrong for odd ones (so the rewards
    of a group differ); the ranker shows the three answer passages to even samples, none to odd ones."""
    role, *rest = key
    if role == "judge":  # LLM-as-judge (rl.judge): the first shown passage is relevant, the others are not
        return "Yes." if rest[2] == 0 else "no"
    if role == "ranker":
        sample = rest[2]
        return "<reason>r</reason><rerank>" + ("[2] > [1] > [3]" if sample % 2 == 0 else "[5] > [4] > [6]") + "</rerank>"
    sample, turn = rest[2], rest[3]
    if turn == 0:
        return search_turn(f"query {rest[1]} {sample % 3}")
    return answer_turn(GOLD[rest[1]] if sample % 2 == 0 else "Paris")


def trainer(tok, model, out_dir, *, method="cosearch", steps=2, shared=False, val_questions=(), eval_every=0,
            scorer=None, rules=None, dp=None, questions_per_step=2, seed=0, **kw):
    """The scripted joint trainer; ``rules`` (a config.RuleSet; None: the paper's) reaches every stage by
    construction, as a profile's ``rules:`` does. ``dp``: this rank of a data-parallel job (None: one process)."""
    rules = PAPER_RULES if rules is None else rules
    cfg = TrainConfig(method=method, steps=steps, questions_per_step=questions_per_step, group_size=4, agent_lr=1e-2, ranker_lr=1e-2,
                      micro_batch=1, eval_every=eval_every, shared_backbone=shared,
                      grouping=GroupingConfig(k_min=2, rules=rules), rules=rules, **kw)
    roles = cfg.roles()
    peft = lora_model(model, dict.fromkeys(dict.fromkeys(v for v in roles.values() if v)), LORA)
    policies = PolicySet(peft, roles, cfg.trainable(), {"agent": 1e-2, "ranker": 1e-2, "shared": 1e-2})
    rollout = RolloutConfig(search=SearchBudget(max_searches=2, topn=6, topk=3), temperature=1.0, agent_max_new_tokens=64,
                            rules=rules)
    inputs = TrainerInputs(policies, tok, FixedRetriever(CORPUS), QUESTIONS, rollout, ProtocolConfig(search=SearchBudget(topk=3)),
                           val_questions=val_questions, backend=ScriptedBackend(tok, script, model=peft),
                           scorer=scorer)
    return JointTrainer(cfg, inputs, out_dir=out_dir, seed=seed, progress=False, **({"dp": dp} if dp is not None else {}))


# ------------------------------------------------------------------------------ vLLM's outputs, as the real engine returned them

#: Written by tests/test_vllm_engine.py from a real vLLM engine (make test-vllm).
VLLM_FIXTURE = Path(__file__).parent / "fixtures" / "vllm_request_outputs.json"


def recorded_vllm_cases() -> list[dict]:
    """The recorded requests: each case (eos, stop, length) with its prompts and serialised outputs."""
    return json.loads(VLLM_FIXTURE.read_text())["cases"]


def replayed_request_output(o: dict) -> SimpleNamespace:
    """A recorded output rebuilt with the attributes vLLM's RequestOutput has (``outputs[0]``: text,
    token_ids, logprobs as {token id: object with .logprob}, finish_reason, stop_reason)."""
    steps = [{int(t): SimpleNamespace(logprob=lp) for t, lp in step.items()} for step in o["logprobs"]]
    return SimpleNamespace(outputs=[SimpleNamespace(text=o["text"], token_ids=list(o["token_ids"]), logprobs=steps,
                                                    finish_reason=o["finish_reason"], stop_reason=o["stop_reason"])])
