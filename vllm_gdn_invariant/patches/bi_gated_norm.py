"""Patch: under batch-invariant mode the gated RMSNorm after the GDN core tiles one row per
program, whatever the number of rows.

* **Targets**: ``calc_rows_per_block`` (``vllm/third_party/flash_linear_attention/ops/
  layernorm_guard.py``), which ``layer_norm_fwd`` (0.26-0.29) and ``LayerNormFwdKernel`` (its
  launch and its warmup, 0.30+) look up when they launch ``layer_norm_fwd_kernel`` for
  ``RMSNormGated.forward_cuda`` (``rmsnorm_fn``); and, in vLLM 0.34, the same function as
  ``vllm/models/qwen3_5/nvidia/ops/fused_gdn_gated_norm.py`` imports it for Qwen3.5's fused
  gated norm (a second name binding, replaced on its own).
* **Why**: ``calc_rows_per_block(M)`` is ``min(next_power_of_2(cdiv(M, 2 * SMs)), 4)``: the
  rows (tokens x value heads) of the whole step decide whether a program normalizes 1, 2 or
  4 rows as one ``[ROWS_PER_BLOCK, BLOCK_N]`` tile. The tile shape is a compile-time constant
  that changes the kernel's thread layout and with it the order of the per-row reduction, so
  a row's bits may depend on how many other rows share the step. The replacement returns 1,
  the value vLLM itself picks for up to ``2 * SMs`` rows (every decode step of up to
  ``2 * SMs / num_v_heads`` requests runs exactly as without the patch); larger steps launch
  more, smaller programs.
* **Upstream**: none.
* **Remove when**: vLLM fixes the tile under batch-invariant mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1;
  vllm.models.qwen3_5.nvidia.ops.fused_gdn_gated_norm:calc_rows_per_block from vLLM 0.34.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import GROUP

LAYERNORM_GUARD_MODULE = "vllm.third_party.flash_linear_attention.ops.layernorm_guard"
QWEN3_5_GATED_NORM_MODULE = "vllm.models.qwen3_5.nvidia.ops.fused_gdn_gated_norm"

ROWS_PER_BLOCK = SourceTarget(LAYERNORM_GUARD_MODULE, "calc_rows_per_block")
LAYER_NORM_FWD = SourceTarget(LAYERNORM_GUARD_MODULE, "layer_norm_fwd")
LAYER_NORM_KERNEL_CLASS = SourceTarget(LAYERNORM_GUARD_MODULE, "LayerNormFwdKernel")
QWEN3_5_GATED_NORM = SourceTarget(QWEN3_5_GATED_NORM_MODULE, "fused_gdn_gated_rms_norm")

FIXED_ROWS_PER_BLOCK = 1


def make_rows_per_block(original: Callable[..., int]) -> Callable[..., int]:
    """The replacement (installed only under ``VLLM_BATCH_INVARIANT=1``): always one row."""

    def calc_rows_per_block(M: int, device: Any) -> int:  # noqa: N803 - vLLM's signature
        return FIXED_ROWS_PER_BLOCK

    return calc_rows_per_block


QWEN3_5_FUSED_NORM_SINCE = "0.34.0"  # vllm/models/qwen3_5/nvidia/ops


def gated_norm_patches() -> list[Patch]:
    """The layernorm_guard patch, and the Qwen3.5 binding (from vLLM 0.34, which has that
    module)."""
    return [
        Patch(
            target=ROWS_PER_BLOCK,
            replacement=make_rows_per_block,
            why="gated RMSNorm after the GDN core: one row per program, not a count of the step",
            relies_on=(LAYER_NORM_FWD, LAYER_NORM_KERNEL_CLASS),
            label="gated-norm-rows-1",
            group=GROUP,
        ),
        Patch(
            target=ROWS_PER_BLOCK,
            replacement=make_rows_per_block,
            why="the same for Qwen3.5's fused gated norm (vLLM 0.34), which imports it",
            relies_on=(QWEN3_5_GATED_NORM,),
            binding=QWEN3_5_GATED_NORM_MODULE,
            label="gated-norm-rows-1",
            group=GROUP,
            since=QWEN3_5_FUSED_NORM_SINCE,
        ),
    ]
