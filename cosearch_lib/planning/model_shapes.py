"""The shapes of the models a profile names, for the job planner: parameters, KV-cache bytes per
token, LoRA parameters, activation bytes per token.

Shapes are read from a local model folder's ``config.json`` where the name is one, else from
:data:`KNOWN_SHAPES` (the published configurations of the models the profiles name, so a plan needs
no download). Counting follows the architectures: a decoder layer holds the attention projections
(query and output ``hidden x heads*head_dim``, key and value ``hidden x kv_heads*head_dim``, Qwen2's
query/key/value biases) and the gated MLP (three ``hidden x mlp`` matrices); embeddings are counted
once when the LM head is tied to them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cosearch_lib.config import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """One architecture. ``kind``: ``"causal_lm"`` (a policy) or ``"encoder"`` (the retriever's)."""

    name: str
    kind: str
    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False

    @property
    def parameters(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.mlp if self.kind == "causal_lm" else 2 * h * self.mlp
        layer = attention + mlp + 2 * h
        embeddings = self.vocab * h * (1 if self.tied or self.kind == "encoder" else 2)
        return self.layers * layer + embeddings + h

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of key and value cache one token holds over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def lora_parameters(self, r: int, target_modules: tuple[str, ...]) -> int:
        """Parameters of one LoRA adapter of rank ``r``: ``r x (in + out)`` per targeted matrix per layer."""
        h, q, kv, f = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.mlp
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
        return self.layers * sum(r * sum(shapes[m]) for m in target_modules if m in shapes)

    def activation_bytes(self, tokens: int, sequence: int, *, checkpointing: bool, attention: str,
                         dtype_bytes: int = 2) -> int:
        """Activations a forward pass keeps for the backward pass, for ``tokens`` tokens in sequences of
        ``sequence`` tokens, in ``dtype_bytes`` precision (the counts below are for 16 bits). Per layer and token, ``34 x hidden`` bytes of the
        layer's intermediate tensors, plus ``5 x heads x sequence`` bytes of attention scores where
        attention materialises them (``attention="eager"``: the transformers path with a mask;
        ``"flash"``: fused kernels that keep none) (Korthikanti et al. 2022, "Reducing activation
        recomputation", Section 4.1, without tensor parallelism). With ``checkpointing`` a layer keeps
        only its input (``2 x hidden`` bytes per token) and one layer at a time is recomputed in full.
        Then the logits: in the model's precision, a float32 copy, its log-softmax and their gradient,
        ``(dtype_bytes + 12) x vocab`` bytes per token."""
        scores = 5 * self.heads * sequence if attention == "eager" else 0
        full_layer = tokens * (34 * self.hidden + scores)
        layers = self.layers * tokens * 2 * self.hidden + full_layer if checkpointing else self.layers * full_layer
        return layers * dtype_bytes // 2 + tokens * (dtype_bytes + 12) * self.vocab


def _qwen25(name: str, layers: int, hidden: int, mlp: int, heads: int, kv_heads: int, tied: bool) -> ModelShape:
    return ModelShape(name, "causal_lm", layers, hidden, mlp, heads, kv_heads, hidden // heads,
                      152064 if not tied else 151936, tied=tied, qkv_bias=True)


#: Published configurations (each model's config.json on the Hugging Face hub) of the models the
#: profiles name, by lower-cased name; instruct and base variants share a shape.
KNOWN_SHAPES: dict[str, ModelShape] = {
    "qwen/qwen2.5-7b-instruct": _qwen25("Qwen2.5-7B", 28, 3584, 18944, 28, 4, tied=False),
    "qwen/qwen2.5-3b-instruct": _qwen25("Qwen2.5-3B", 36, 2048, 11008, 16, 2, tied=True),
    "qwen/qwen2.5-1.5b-instruct": _qwen25("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, tied=True),
    "qwen/qwen2.5-0.5b-instruct": _qwen25("Qwen2.5-0.5B", 24, 896, 4864, 14, 2, tied=True),
    "smollm2-135m-instruct": ModelShape("SmolLM2-135M", "causal_lm", 30, 576, 1536, 9, 3, 64, 49152),
    "intfloat/e5-base-v2": ModelShape("e5-base-v2", "encoder", 12, 768, 3072, 12, 12, 64, 30522),
    "all-minilm-l6-v2": ModelShape("all-MiniLM-L6-v2", "encoder", 6, 384, 1536, 12, 12, 32, 30522),
}
for _base in ("7b", "3b", "1.5b", "0.5b"):
    KNOWN_SHAPES[f"qwen/qwen2.5-{_base}"] = KNOWN_SHAPES[f"qwen/qwen2.5-{_base}-instruct"]
KNOWN_SHAPES["huggingfacetb/smollm2-135m-instruct"] = KNOWN_SHAPES["smollm2-135m-instruct"]
KNOWN_SHAPES["sentence-transformers/all-minilm-l6-v2"] = KNOWN_SHAPES["all-minilm-l6-v2"]


def shape_from_config(config: dict, name: str) -> ModelShape:
    """A shape from a Hugging Face ``config.json`` (Llama/Qwen2/BERT field names)."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        decoder = "num_key_value_heads" in config or config.get("model_type") in ("llama", "qwen2", "mistral")
        return ModelShape(
            name, "causal_lm" if decoder else "encoder", int(config["num_hidden_layers"]), hidden,
            int(config["intermediate_size"]), heads, int(config.get("num_key_value_heads", heads)),
            int(config.get("head_dim") or hidden // heads), int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", True)), qkv_bias=config.get("model_type") == "qwen2")
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"model {name!r}: its config.json lacks a field the planner needs ({err})") from err


def model_shape(name: str) -> ModelShape:
    """The shape of the model a profile names: a local folder's ``config.json``, else :data:`KNOWN_SHAPES`."""
    folder = Path(name).expanduser()
    if (folder / "config.json").is_file():
        return shape_from_config(json.loads((folder / "config.json").read_text()), folder.name)
    shape = KNOWN_SHAPES.get(name.lower())
    if shape is None:
        known = ", ".join(sorted(k for k in KNOWN_SHAPES if "/" in k or "-" in k))
        raise ConfigError(f"no shape known for model {name!r}: give a local model folder (with config.json) "
                          f"or one of {known}")
    return shape
