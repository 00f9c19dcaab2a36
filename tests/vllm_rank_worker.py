"""One rank of a 2-process gloo job with its own vLLM engine, started by torchrun from
tests/test_vllm_engine.py::

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/vllm_rank_worker.py OUT.json

Each rank joins the job (``DataParallel.from_environment``), starts the engine as a trainer does
(``VLLMBackend.from_model``: external-launcher mode, since a process group exists), samples its
share of the rows with per-row seeds, and rank 0 writes every row's tokens, in row order, with
each rank's engine settings, to OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.vllm_backend import VLLMBackend
from cosearch_lib.rl.data_parallel import DataParallel

#: What the engine fixture of tests/test_vllm_engine.py uses; the test compares against it.
ENGINE = dict(dtype="float32", max_model_len=1024, max_lora_rank=8, max_loras=2, seed=0, kv_cache_gib=1)
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=11)


def rows(questions: list[str], chat: ChatTokens) -> tuple[list[list[int]], list[tuple]]:
    """Every question twice (two samples of one prompt), keyed as a rollout keys its rows."""
    prompts = [chat.prompt_ids([{"role": "user", "content": q}]) for q in questions]
    return [p for p in prompts for _ in range(2)], [("q", i, s) for i in range(len(prompts)) for s in range(2)]


def main(out: Path, questions: list[str]) -> None:
    dp = DataParallel.from_environment()
    engine = VLLMBackend.from_model("smollm2-135m-instruct", **ENGINE)
    prompts, keys = rows(questions, ChatTokens(engine.tokenizer))
    mine = dp.owned(len(prompts))
    local = engine.generate([prompts[i] for i in mine], SAMPLING, row_keys=[keys[i] for i in mine])
    tokens = dp.gather_shards([list(g.token_ids) for g in local])
    executors = dp.gather(engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend)
    per_rank = dp.gather(len(mine))
    if dp.is_main:
        out.write_text(json.dumps({"tokens": tokens, "executors": executors, "rows_per_rank": per_rank}))
    dp.barrier()
    engine.close()  # as `cosearch train` does (close_engines): the engine leaves before the job's groups go
    dp.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
