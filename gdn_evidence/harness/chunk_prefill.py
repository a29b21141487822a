"""Inputs of a varlen GDN chunk prefill (FLA's ``chunk_gated_delta_rule``, batch 1).

One generator draws, in order, q, k, v (standard normal, bfloat16), the log decay
(``-U(0, 0.2)``, float32) and beta (``U(0, 1)``, bfloat16) on the CPU, then moves them to
``device``: a seed gives the same bits on every device, so the GPU tests, the stage-by-stage
diagnostic and the interpreter check draw the same sequences.
"""

from __future__ import annotations

import torch
from torch import Tensor


def varlen_inputs(
    total: int, seed: int, heads: int, key_dim: int, value_dim: int, device: torch.device | str
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """q, k ``[1, total, heads, key_dim]``, v ``[1, total, heads, value_dim]``, log decay and
    beta ``[1, total, heads]``."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16).to(device)

    q, k = randn(1, total, heads, key_dim), randn(1, total, heads, key_dim)
    v = randn(1, total, heads, value_dim)
    decay = -torch.rand(1, total, heads, generator=g).mul(0.2).to(device)
    beta = torch.rand(1, total, heads, generator=g).to(torch.bfloat16).to(device)
    return q, k, v, decay, beta


def cu_seqlens(lengths: list[int], device: torch.device | str) -> Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32 on ``device``."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).to(
        device
    )
