"""Launch shapes of the golden-matched kernels to time beside the defaults
(``scripts/bench_decode.py --sweep``) and to check for bits on a GPU
(``tests/gpu/test_kernels_bitwise.py``); a launch shape changes the speed, never the bits.

Recurrent (``RecurrentConfig``): the plain split of the padded K (``J`` slabs x lanes x vector:
``row_split``'s, 32 elements of a row per thread in 16-byte vectors) and one other, half the vector
for a 2-byte state (more slabs, fewer elements per shuffle level) and twice the lanes for fp32
(fewer registers); for each, programs of 1 warp with 1 or 2 value rows per thread and of 2 warps
with 1, taking 1, 4, 8 or 16 blocks of value rows in turn (``chunks``: the per-program work, loads
and norms of q and k and the gates, is shared by the blocks, and the next block's loads go out
before this block's arithmetic); and the two shapes an earlier sweep found fastest (32 and 64 rows
over 2 warps); and the shape that was the default before SHAPE_RULES (4 warps of 2 (fp32) or 4
(bf16) value rows per thread); and vLLM's layout (the whole padded K as one slab, 16-byte
vectors across the lanes, one warp of 8, 16 or 32 value rows, and 32 rows over 2 warps).

Conv (``ConvConfig``): 128 to 1024 channels per program over 1 to 8 warps.
"""

from __future__ import annotations

import torch

from gdn_evidence.harness.layer import STATE_DTYPES
from vllm_gdn_invariant.kernels import conv as conv_kernel
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.launch import next_power_of_2
from vllm_gdn_invariant.kernels.validation import ConvDims, RecurrentDims

QWEN3_NEXT_HEADS = {"H": 16, "HV": 32, "K": 128, "V": 128}  # per layer at TP1
QWEN3_NEXT_CONV = {"dim": 8192, "taps": 4}  # conv channels (2 H K + HV V) and width
CHUNKS = (1, 4, 8, 16)
PROGRAMS = ((1, 1), (1, 2), (2, 1))  # (warps, value rows per thread)
EARLIER_BEST_BLOCK_V = (32, 64)  # over 2 warps, chunks 1
EARLIER_DEFAULT_ROWS_PER_THREAD = {torch.float32: 2, torch.bfloat16: 4}  # over 4 warps
VLLM_LAYOUT_PROGRAMS = ((8, 1), (16, 1), (32, 1), (32, 2))  # (value rows, warps), one slab


def other_split(plain: tuple[int, int, int], state_dtype: torch.dtype):
    """(log2_cl, log2_vec) of the second split of K beside the plain (log2_j, log2_cl,
    log2_vec): half the vector for a 2-byte state, twice the lanes for a 4-byte one; None
    where there is none."""
    log2_j, log2_cl, log2_vec = plain
    if state_dtype.itemsize <= 2:
        if log2_vec == 0:
            return None
        return log2_cl, log2_vec - 1
    if log2_cl >= 5 or log2_j == 0:
        return None
    return log2_cl + 1, log2_vec


def recurrent_candidates(
    dims: RecurrentDims, state_dtype: torch.dtype
) -> list[recurrent_kernel.RecurrentConfig]:
    """The recurrent kernel's launch shapes of the module docstring, the default left out."""
    default = recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False)
    plain = recurrent_kernel.row_split(dims.head_k, state_dtype)
    log2_j, log2_cl, log2_vec = plain
    width = sum(plain)
    rows_per_warp = 32 >> log2_cl  # of the plain split
    block_limit = next_power_of_2(dims.head_v)
    splits = [(log2_cl, log2_vec)]
    second = other_split(plain, state_dtype)
    if second is not None:
        splits.append(second)
    configs = []
    for split_cl, split_vec in splits:
        for num_warps, rows_per_thread in PROGRAMS:
            block_v = (32 >> split_cl) * num_warps * rows_per_thread
            for chunks in CHUNKS:
                if block_v * chunks <= block_limit:
                    configs.append(
                        recurrent_kernel.RecurrentConfig(
                            block_v, width - split_cl - split_vec, split_cl, split_vec, num_warps,
                            chunks,
                        )
                    )  # fmt: skip
    for block_v in EARLIER_BEST_BLOCK_V:
        if 2 * rows_per_warp <= block_v <= block_limit:
            configs.append(recurrent_kernel.RecurrentConfig(block_v, *plain, 2))
    earlier_block_v = rows_per_warp * 4 * EARLIER_DEFAULT_ROWS_PER_THREAD[state_dtype]
    if dims.batch * dims.num_v_heads < 512:  # one row per thread there
        earlier_block_v = rows_per_warp * 4
    earlier_block_v = min(earlier_block_v, block_limit)
    warps = max(1, min(4, earlier_block_v // rows_per_warp))
    configs.append(recurrent_kernel.RecurrentConfig(earlier_block_v, *plain, warps))
    vector = recurrent_kernel.TILE_VECTOR_BYTES // state_dtype.itemsize
    one_slab = recurrent_kernel.row_split(dims.head_k, state_dtype, row_elements=vector)
    for block_v, num_warps in VLLM_LAYOUT_PROGRAMS:
        if (32 >> one_slab[1]) * num_warps <= block_v <= block_limit:
            configs.append(recurrent_kernel.RecurrentConfig(block_v, *one_slab, num_warps))
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


def qwen3_next_dims(batch: int) -> RecurrentDims:
    """The recurrent step's dims at Qwen3-Next's heads, QK norm on."""
    H, HV, K, V = (QWEN3_NEXT_HEADS[name] for name in ("H", "HV", "K", "V"))
    return RecurrentDims(batch, H, HV, K, V, K**-0.5, True)


def qwen3_next_default(
    op: str, batch: int, state_dtype: torch.dtype, conv_dim_first: bool = True
) -> dict:
    """The package's default launch shape of ``op`` at Qwen3-Next's heads and conv
    (``QWEN3_NEXT_HEADS``, ``QWEN3_NEXT_CONV``; the conv cache dim-first or state-first), as the
    sweep records shapes."""
    if op == "recurrent":
        dims = qwen3_next_dims(batch)
        return recurrent_kernel.recurrent_config(dims, state_dtype, interpreted=False).__dict__
    if op == "conv":
        conv = QWEN3_NEXT_CONV
        dims = ConvDims(batch, conv["dim"], conv["taps"], conv_dim_first, True)
        return conv_kernel.conv_config(dims, interpreted=False).__dict__
    raise ValueError(f"no launch shape for op {op!r}")


def default_sweep_row(case: dict, conv_dim_first: bool = True) -> dict:
    """The row of a ``bench_decode.py --sweep`` case (one op, state dtype and batch size) that
    times the package's default shape now (of a sweep whose conv caches were dim-first or not);
    ValueError where the sweep did not time it."""
    shape = qwen3_next_default(
        case["op"], case["batch"], STATE_DTYPES[case["state_dtype"]], conv_dim_first
    )
    rows = [r for r in case["sweep"] if r["config"] == shape]
    if len(rows) != 1:
        raise ValueError(f"{case['op']} at B = {case['batch']}: the sweep did not time {shape}")
    return rows[0]
