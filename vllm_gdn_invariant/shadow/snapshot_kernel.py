"""snapshot.py's copies in one launch (CUDA): a window of decode rows, their inputs and blocks.

For ``m`` sampled rows, row ``i`` at position ``p = (start + i) % num_decodes`` of the step with
state index ``s = state_indices[p]``: the kernel writes ``rows[i] = p``, ``blocks[i] =
max(s, 0)``, ``active[i] = s > 0``, copies row ``p`` of ``mixed_qkv``, ``b`` and ``a`` into row
``i`` of their copies, and block ``max(s, 0)`` of the conv and recurrent caches into block
``i + 1`` of their scratch caches, whose block 0 it fills with zeros. Values are copied as
they are (loads and stores of the tensors' own dtype: the bits are kept). Each source row must
be one contiguous run (any row stride: the live caches' blocks are strided). The grid is
``(m, chunks)``: program ``(i, c)`` copies elements ``c * BLOCK ...`` of each of row ``i``'s
five rows. ``start`` and ``num_decodes`` change from step to step and are not specialized on,
so no step compiles a new variant. Only core ``triton.language`` builtins are called, so
Triton's interpreter runs it (tests/shadow/test_snapshot.py pins it to the torch path).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from vllm_gdn_invariant.shadow.compare_kernel import row_elements, rows_readable

BLOCK = 4096


@triton.jit
def copy_row(src_ptr, src_row, src_row_stride, dst_ptr, dst_row, elements, offsets):
    inside = offsets < elements
    values = tl.load(src_ptr + src_row * src_row_stride + offsets, mask=inside)
    tl.store(dst_ptr + dst_row.to(tl.int64) * elements + offsets, values, mask=inside)


@triton.jit(do_not_specialize=["start", "num_decodes"])
def snapshot_kernel(
    state_indices_ptr,
    start,
    num_decodes,
    rows_ptr,
    blocks_ptr,
    active_ptr,
    x_ptr,
    x_row_stride,
    x_copy_ptr,
    x_elements,
    b_ptr,
    b_row_stride,
    b_copy_ptr,
    b_elements,
    a_ptr,
    a_row_stride,
    a_copy_ptr,
    a_elements,
    conv_ptr,
    conv_row_stride,
    conv_scratch_ptr,
    conv_elements,
    ssm_ptr,
    ssm_row_stride,
    ssm_scratch_ptr,
    ssm_elements,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    chunk = tl.program_id(1)
    position = ((start + i) % num_decodes).to(tl.int64)
    index = tl.load(state_indices_ptr + position)
    block = tl.maximum(index, 0)
    if chunk == 0:
        tl.store(rows_ptr + i, position)
        tl.store(blocks_ptr + i, block)
        tl.store(active_ptr + i, index > 0)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    block = block.to(tl.int64)
    copy_row(x_ptr, position, x_row_stride, x_copy_ptr, i, x_elements, offsets)
    copy_row(b_ptr, position, b_row_stride, b_copy_ptr, i, b_elements, offsets)
    copy_row(a_ptr, position, a_row_stride, a_copy_ptr, i, a_elements, offsets)
    copy_row(conv_ptr, block, conv_row_stride, conv_scratch_ptr, i + 1, conv_elements, offsets)
    copy_row(ssm_ptr, block, ssm_row_stride, ssm_scratch_ptr, i + 1, ssm_elements, offsets)
    if i == 0:  # the null blocks
        conv_zeros = tl.full((BLOCK,), 0, conv_scratch_ptr.dtype.element_ty)
        tl.store(conv_scratch_ptr + offsets, conv_zeros, mask=offsets < conv_elements)
        ssm_zeros = tl.full((BLOCK,), 0, ssm_scratch_ptr.dtype.element_ty)
        tl.store(ssm_scratch_ptr + offsets, ssm_zeros, mask=offsets < ssm_elements)


def kernel_applies(*sources: Tensor) -> bool:
    """Whether the kernel can copy rows of ``sources``: each row one contiguous run."""
    return all(rows_readable(t) and t.stride(-1) == 1 for t in sources)


def kernel_arguments(
    start: int,
    count: int,
    state_indices: Tensor,
    sources: tuple[Tensor, ...],
    rows: Tensor,
    blocks: Tensor,
    active: Tensor,
    copies: tuple[Tensor, ...],
) -> tuple[tuple[int, int], tuple, dict[str, int]]:
    """(grid, positional arguments, constexprs) of ``snapshot_kernel``."""
    arguments: list = [state_indices, start, state_indices.numel(), rows, blocks, active]
    for source, copy in zip(sources, copies, strict=True):
        arguments += [source, source.stride(0), copy, row_elements(source)]
    chunks = triton.cdiv(max(row_elements(t) for t in sources), BLOCK)
    return (count, chunks), tuple(arguments), {"BLOCK": BLOCK}


def copy_window(
    start: int,
    count: int,
    state_indices: Tensor,
    sources: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    rows: Tensor,
    blocks: Tensor,
    active: Tensor,
    copies: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
) -> None:
    """Fill ``rows``, ``blocks``, ``active`` and ``copies`` (of ``mixed_qkv``, ``b``, ``a``
    ``[count, ...]`` and the conv and recurrent scratch caches ``[count + 1, ...]``) from
    ``sources`` (``mixed_qkv``, ``b``, ``a``, conv cache, recurrent cache), one launch."""
    grid, arguments, constexprs = kernel_arguments(
        start, count, state_indices, sources, rows, blocks, active, copies
    )
    snapshot_kernel[grid](*arguments, **constexprs)
