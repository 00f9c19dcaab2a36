"""Reinforcement learning: rewards (Eq. 4 and 6), semantic grouping (Alg. 2), the GRPO loss, the
policy update, the joint trainer, live logging of its steps and the supervised warm start.
"""
