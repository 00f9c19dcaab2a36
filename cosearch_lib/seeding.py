"""The one seeding function, and seeds derived from (step, question, sample)-style keys."""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and (when imported) torch, and ask torch for deterministic kernels on CPU."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import torch
    except ImportError:  # torch is a core dependency, but seeding must not require it
        return
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable key, e.g. ``derive_seed(base, step, qid, sample)``.

    Unlike ``hash()``, the value does not change between processes.
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def rng(*parts: object) -> np.random.Generator:
    """A NumPy generator seeded from ``derive_seed(*parts)``."""
    return np.random.default_rng(derive_seed(*parts))


def step_order(n: int, step: int, per_step: int, seed: int, stream: str = "train-order") -> list[int]:
    """Indices of the items of training ``step``: consecutive slices of seeded permutations of
    range(n), one permutation per epoch, so a step's items depend only on (seed, stream, step).
    ``stream`` names the sequence ("train-order": the joint trainer's questions).

    A step never holds an item twice: where a step spans two epochs, the next epoch's permutation
    starts with items the step has not taken yet (the rest keep their seeded order). Without that,
    a question could appear twice in one step, its copies sampled with the same row keys."""
    if n < 1:
        raise ValueError("nothing to train on: an empty item list")
    if per_step > n:
        raise ValueError(f"{per_step} items per step but only {n} to draw from: a step would hold one twice "
                         "(ask for no more items per step than there are)")
    last_epoch = ((step + 1) * per_step - 1) // n
    perms = [rng(stream, seed, 0).permutation(n).tolist()]
    for epoch in range(1, last_epoch + 1):
        raw = rng(stream, seed, epoch).permutation(n).tolist()
        taken = (epoch * n) % per_step  # items of the step that spans the boundary, from the epoch before
        avoid = set(perms[-1][n - taken:]) if taken else set()
        head = [i for i in raw if i not in avoid][:per_step - taken] if taken else []
        first = set(head)
        perms.append(head + [i for i in raw if i not in first])
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, n)
        out.append(int(perms[epoch][i]))
    return out
