"""Counter-based uniforms: one random number per (row seed, token index), computed on the device.

Why: sampling must depend only on a row's own key (so a trajectory is the same whatever shares its
batch), and the decode loop must not go back to the host for every token. A stateful generator
per row does the first but not the second: each draw is a host call. Here a draw is a pure
function of two integers, the row's 63-bit seed and the index of the token in the generation, so
all rows draw at once with a handful of integer tensor operations wherever the logits live, and
the same (seed, index) gives the same number on the CPU and on a GPU.

The mixing function is the 32-bit "PCG hash" (a permuted congruential step followed by an xorshift
and a multiply; Jarzynski and Olano, "Hash Functions for GPU Rendering", JCGT 2020), chained over
the seed's two halves and the counter. Every intermediate product stays below 2**62, so signed
64-bit tensor arithmetic never overflows and the result is bit-identical across devices. Two
independent 32-bit words give a float64 uniform in [0, 1) with 53 random bits.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_STREAM_A, _STREAM_B = 0x9E3779B9, 0x85EBCA6B  # odd constants that separate the two 32-bit words


def pcg_hash(x: torch.Tensor) -> torch.Tensor:
    """PCG hash of 32-bit values held in an int64 tensor; returns 32-bit values (int64)."""
    state = (x * 747796405 + 2891336453) & _MASK32  # < 2**62 before the mask
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK32
    return (word >> 22) ^ word


def seed_halves(seeds: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """(B, 2) int64: the low and high 32 bits of each non-negative 63-bit row seed."""
    if any(s < 0 or s >= 1 << 63 for s in seeds):
        raise ValueError("row seeds must be in [0, 2**63)")
    return torch.tensor([[s & _MASK32, s >> 32] for s in seeds], dtype=torch.long, device=device).reshape(-1, 2)


def counter_uniforms(halves: torch.Tensor, counter: int | torch.Tensor) -> torch.Tensor:
    """(B,) float64 uniforms in [0, 1): row b's number for token index ``counter`` (an int or (B,))."""
    lo, hi = halves[:, 0], halves[:, 1]
    t = torch.as_tensor(counter, dtype=torch.long, device=halves.device) & _MASK32
    key = pcg_hash(lo ^ pcg_hash(hi))  # (B,) the row's 32-bit key ...
    key2 = pcg_hash(hi ^ pcg_hash(lo ^ _STREAM_A))  # (B,) ... and a second, independent one
    a = pcg_hash(key ^ pcg_hash(t))  # (B,) 32 random bits
    b = pcg_hash(key2 ^ pcg_hash(t ^ _STREAM_B))  # (B,) 32 more
    bits = ((a >> 5) << 26) | (b >> 6)  # 27 + 26 = 53 bits
    return bits.to(torch.float64) * (1.0 / (1 << 53))
