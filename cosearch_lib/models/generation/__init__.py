"""Generation: one contract, three engines (transformers, vLLM, Unsloth's vLLM), and what they share.

Modules (``cosearch_lib.models.generation.<name>``):

* ``contract`` - ``Generation``, the ``GenerationBackend`` protocol, ``row_seeds``, ``find_stop``,
  ``prefix_scope``, ``bf16_scope``, ``check_prompts``.
* ``sampling`` - logits and uniforms to tokens and log-probs (``sample_tokens``); the eos / stop /
  length rules (``Finisher``).
* ``adapters`` - LoRA adapter switching (``adapter_context``, ``merged_adapter``) and bf16 decoding copies
  (``bf16_decoding_copy``); imports no backend.
* ``transformers_backend`` - ``TransformersBackend``, our batched decode loop (CPU or GPU), with the
  speed-only helpers it alone runs on: ``prefix_cache``, ``counter_rng``, ``grouped_attention``,
  ``growing_cache``.
* ``vllm_backend`` - ``VLLMBackend`` (vLLM or Unsloth's engine, GPU), ``resolved_model_path``.
* ``backend_factory`` - ``make_backend`` by kind.
* ``teacher_forced`` - ``reference_logprobs``, the teacher-forced log-probs generation is tested against.

This file imports none of them, so importing ``adapters`` (the policy update does) loads no engine.
"""
