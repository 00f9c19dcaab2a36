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
