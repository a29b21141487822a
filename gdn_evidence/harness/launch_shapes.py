"""Launch shapes of the golden-matched kernels to time beside the defaults
(``scripts/bench_decode.py --sweep``) and to check for bits on a GPU
(``tests/gpu/test_kernels_bitwise.py``); a launch shape changes the speed, never the bits.

Recurrent (``RecurrentConfig``): the default's split of the padded K (``J`` slabs x lanes x
vector) and one other, half the vector for a 2-byte state (more slabs, fewer elements per
shuffle level) and twice the lanes for fp32 (fewer registers); for each, programs of 1 warp
with 1 or 2 value rows per thread and of 2 warps with 1, taking 1, 4, 8 or 16 blocks of value
rows in turn (``chunks``: the per-program work, loads and norms of q and k and the gates, is
shared by the blocks, and the next block's loads go out before this block's arithmetic); and
the two shapes the earlier sweep found fastest (32 and 64 rows over 2 warps).

Conv (``ConvConfig``): 128 to 1024 channels per program over 1 to 8 warps.
"""

from __future__ import annotations

import torch

from vllm_gdn_invariant.kernels import conv as conv_kernel
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.launch import next_power_of_2
from vllm_gdn_invariant.kernels.validation import RecurrentDims

CHUNKS = (1, 4, 8, 16)
PROGRAMS = ((1, 1), (1, 2), (2, 1))  # (warps, value rows per thread)
EARLIER_BEST_BLOCK_V = (32, 64)  # over 2 warps, chunks 1


def other_split(default: recurrent_kernel.RecurrentConfig, state_dtype: torch.dtype):
    """(log2_cl, log2_vec) of the second split of K: half the vector for a 2-byte state,
    twice the lanes for a 4-byte one; None where there is none."""
    if state_dtype.itemsize <= 2:
        if default.log2_vec == 0:
            return None
        return default.log2_cl, default.log2_vec - 1
    if default.log2_cl >= 5 or default.log2_j == 0:
        return None
    return default.log2_cl + 1, default.log2_vec


def recurrent_candidates(
    dims: RecurrentDims, state_dtype: torch.dtype
) -> list[recurrent_kernel.RecurrentConfig]:
    """The recurrent kernel's launch shapes of the module docstring, the default left out."""
    default = recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False)
    width = default.log2_j + default.log2_cl + default.log2_vec
    block_limit = next_power_of_2(dims.head_v)
    splits = [(default.log2_cl, default.log2_vec)]
    second = other_split(default, state_dtype)
    if second is not None:
        splits.append(second)
    configs = []
    for log2_cl, log2_vec in splits:
        log2_j = width - log2_cl - log2_vec
        rows_per_warp = 32 >> log2_cl
        for num_warps, rows_per_thread in PROGRAMS:
            block_v = rows_per_warp * num_warps * rows_per_thread
            for chunks in CHUNKS:
                if block_v * chunks <= block_limit:
                    configs.append(
                        recurrent_kernel.RecurrentConfig(
                            block_v, log2_j, log2_cl, log2_vec, num_warps, chunks
                        )
                    )
    for block_v in EARLIER_BEST_BLOCK_V:
        if 2 * (32 >> default.log2_cl) <= block_v <= block_limit:
            configs.append(
                recurrent_kernel.RecurrentConfig(
                    block_v, default.log2_j, default.log2_cl, default.log2_vec, 2
                )
            )
    unique = list(dict.fromkeys(configs))
    return [c for c in unique if c != default]


def conv_candidates() -> list[conv_kernel.ConvConfig]:
    """The conv kernel's launch shapes: channels per program and warps."""
    return [
        conv_kernel.ConvConfig(block_d, num_warps)
        for block_d in (128, 256, 512, 1024)
        for num_warps in (1, 2, 4, 8)
        if 32 * num_warps <= block_d
    ]
