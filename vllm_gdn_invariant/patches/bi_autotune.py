"""Patch: under batch-invariant mode the autotuned Triton kernels of the GDN prefill run one
fixed config, so that no process picks another tile than the last one.

* **Targets**: the eleven ``@triton.autotune`` kernels of vLLM's FLA chunk prefill
  (``vllm/third_party/flash_linear_attention/ops/``): ``chunk_delta_h``'s
  ``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``, ``chunk_o``'s ``chunk_fwd_kernel_o``,
  ``chunk_scaled_dot_kkt``'s ``chunk_scaled_dot_kkt_fwd_kernel``, ``cumsum``'s
  ``chunk_local_cumsum_scalar_kernel`` and ``chunk_local_cumsum_vector_kernel``, ``l2norm``'s
  ``l2norm_fwd_kernel1`` and ``l2norm_fwd_kernel``, ``solve_tril``'s
  ``solve_tril_16x16_kernel``, ``merge_16x16_to_32x32_inverse_kernel`` and
  ``merge_16x16_to_64x64_inverse_kernel``, ``wy_fast``'s ``recompute_w_u_fwd_kernel``; each
  replaced in its module by a copy of its autotuner whose config list is the one config
  :func:`pinned_config` picks from vLLM's own list.
* **Why**: Triton autotunes a kernel on its first launch per key, by timing every config, and
  keeps the fastest for the process. The configs tile the work differently (value and key
  blocks, warps, pipeline stages), and a tile changes the arithmetic, so two processes, the
  rollout's and a restarted one, or the rollout's and the trainer's, can get other bits for
  the same prompt when the timings rank two configs the other way. With one config there is
  nothing to time. The gated RMSNorm after the GDN core is not autotuned (its tile is the
  row-count heuristic ``bi_gated_norm.py`` pins), nor are the decode kernels.
* **Upstream**: vllm-project/vllm PR #55895 (open) pins Mamba2's SSD configs the same way
  under batch-invariant mode; nothing for the GDN kernels.
* **Remove when**: vLLM pins (or stops autotuning) the FLA chunk kernels under the mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.

The choice is a rule on vLLM's own list (its lists depend on the release and the device), not
a table: 4 warps and 2 stages where the list has them, then the largest tiles, the list's
order breaking ties. Measured on the H200 (``scripts/prefill_config_bits.py``, Qwen3-Next's
32 value heads of 128, free memory filled with NaN before each run): 26 of the lists' 157
configs give other bits than the first config of their list, repeatably (18 of ``chunk_o``,
8 of ``merge_16x16_to_64x64_inverse`` on a 4096-token sequence), and six configs of
``chunk_scaled_dot_kkt`` (a 64-wide key tile with 4 or 8 warps, or a 32-wide one with 8 warps
and 4 stages: two or more key-tile iterations) are not repeatable, run after run, so a
process whose autotuner picked one of them gets other bits from one prefill to the next. The
pinned configs (a 128-wide key tile there: one iteration at Qwen GDN's key dimension) are
repeatable in every measured case. On vLLM's CPU build the kernels are not Triton objects
(Triton has no CPU backend there) and the patch leaves them as they are.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import GROUP

FLA_OPS = "vllm.third_party.flash_linear_attention.ops"
AUTOTUNED_KERNELS = (
    ("chunk_delta_h", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"),
    ("chunk_o", "chunk_fwd_kernel_o"),
    ("chunk_scaled_dot_kkt", "chunk_scaled_dot_kkt_fwd_kernel"),
    ("cumsum", "chunk_local_cumsum_scalar_kernel"),
    ("cumsum", "chunk_local_cumsum_vector_kernel"),
    ("l2norm", "l2norm_fwd_kernel1"),
    ("l2norm", "l2norm_fwd_kernel"),
    ("solve_tril", "solve_tril_16x16_kernel"),
    ("solve_tril", "merge_16x16_to_32x32_inverse_kernel"),
    ("solve_tril", "merge_16x16_to_64x64_inverse_kernel"),
    ("wy_fast", "recompute_w_u_fwd_kernel"),
)
TARGETS = tuple(SourceTarget(f"{FLA_OPS}.{module}", name) for module, name in AUTOTUNED_KERNELS)
PREFERRED_WARPS = 4
PREFERRED_STAGES = 2


def pinned_config(configs: Sequence[Any]) -> Any:
    """The config the pin keeps: the closest to 4 warps, then to 2 stages, then the largest
    tiles (the widest, then the most in all); the list's order breaks ties."""

    def rank(config: Any) -> tuple:
        tiles = [v for v in config.kwargs.values() if isinstance(v, int)]
        return (
            abs(config.num_warps - PREFERRED_WARPS),
            abs(config.num_stages - PREFERRED_STAGES),
            -max(tiles, default=0),
            -sum(tiles),
        )

    return min(configs, key=rank)


def find_autotuner(kernel: Any) -> Any | None:
    """The ``Autotuner`` inside ``kernel`` (through ``triton.heuristics`` wrappers), or None."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return None
    value = kernel
    while value is not None and not isinstance(value, Autotuner):
        value = getattr(value, "fn", None)
    return value


def pin(kernel: Any) -> Any:
    """A copy of ``kernel`` whose autotuner holds the pinned config only (``kernel`` and its
    autotuner unchanged); a kernel without an autotuner comes back as a thin wrapper."""
    tuner = find_autotuner(kernel)
    if tuner is None:
        return _passthrough(kernel)

    def copied(value: Any) -> Any:
        new = copy.copy(value)
        if value is tuner:
            new.configs = [pinned_config(value.configs)]
            new.cache = {}
        else:
            new.fn = copied(value.fn)
        return new

    return copied(kernel)


def _passthrough(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return kernel


def autotune_patches() -> list[Patch]:
    return [
        Patch(
            target=target,
            replacement=pin,
            why="one fixed config for an autotuned FLA chunk-prefill kernel",
            kind="object",
            label="pinned-prefill-configs",
            group=GROUP,
        )
        for target in TARGETS
    ]
