"""The agent and ranker policies at inference time: prompts, parsers, chat-token assembly, ranking
modes and the batched multi-turn rollout engine that produces Trajectory / RankerCall records.
"""
