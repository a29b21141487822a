"""Served and reference tensors for the compare tests: 0-40 ULPs apart in places, with the
special cases the statistics must tell apart."""

from __future__ import annotations

import torch

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def pair(dtype: torch.dtype, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(served, reference)``, flat, of ``n`` elements: an eighth of them moved 0-40 ULPs,
    and at the start and at the very end (the last program's tail in compare_kernel.py) the
    special cases."""
    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(n, generator=g).to(dtype)
    served = reference.clone()
    bits = served.view(BITS[dtype])
    where = torch.randperm(n, generator=g)[: n // 8]
    bits[where] += torch.randint(-40, 41, (where.numel(),), generator=g).to(bits.dtype)
    served[0], reference[0] = 0.0, -0.0  # differ in bits, 0 ULPs
    served[1] = float("nan")  # one side NaN: int64 max
    served[2], reference[2] = float("inf"), float("inf")  # equal, not finite
    served[3], reference[3] = 1.0, -1.0  # across zero
    served[4], reference[4] = float("nan"), -float("nan")  # both NaN: 0 ULPs, bits differ
    served[-1], reference[-1] = 2.0, 3.0  # the last element
    return served, reference


def snapshot_case(
    state_dtype: torch.dtype,
    dim_first: bool,
    device: torch.device,
    heads: tuple[int, int, int, int] = (2, 4, 32, 32),
    rows: int = 3,
    seed: int = 0,
):
    """``(snapshot, golden params)`` of ``rows`` decode rows (a window starting at the
    second of ``rows + 2``) over random caches, ``heads`` = (H, HV, K, V), conv width 4."""
    from vllm_gdn_invariant.shadow.reference import GoldenParams
    from vllm_gdn_invariant.shadow.snapshot import take_snapshot

    h, hv, k, v = heads
    dim, width, num_rows = 2 * h * k + hv * v, 4, rows + 2
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    blocks = num_rows + 2
    conv_cache = randn(blocks, dim, width - 1) if dim_first else randn(blocks, width - 1, dim)
    ssm_cache = randn(blocks, hv, v, k, dtype=state_dtype) * 0.1
    mixed_qkv, b, a = randn(num_rows, dim), randn(num_rows, hv), randn(num_rows, hv)
    state_indices = (torch.randperm(blocks - 1, generator=g)[:num_rows] + 1).to(torch.int32)
    snapshot = take_snapshot(
        1,
        rows,
        state_indices.to(device),
        conv_cache,
        ssm_cache,
        mixed_qkv,
        b,
        a,
    )
    params = GoldenParams(
        conv_weight=randn(dim, width),
        conv_bias=randn(dim),
        activation="silu",
        A_log=randn(hv, dtype=torch.float32),
        dt_bias=randn(hv, dtype=torch.float32),
        num_k_heads=h,
        head_k_dim=k,
    )
    return snapshot, params
