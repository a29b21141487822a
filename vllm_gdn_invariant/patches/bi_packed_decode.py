"""Patch (vLLM 0.33, 0.34): under batch-invariant mode the packed-decode kernel's value tile
on Blackwell does not depend on the batch size.

* **Target**: the kernel object ``fused_recurrent_gated_delta_rule_packed_decode_kernel``
  (``vllm/third_party/flash_linear_attention/ops/fused_recurrent.py``), which
  ``fused_recurrent_gated_delta_rule_packed_decode`` launches once per decode step as
  ``kernel[grid](..., BV=BV, ...)``. The replacement is a launcher around vLLM's kernel.
* **Why**: vLLM 0.33/0.34 choose ``BV`` (the rows of the ``[BV, K]`` state tile a program
  updates) on Blackwell (capability family 100) with ``K == V == 128`` from the batch:
  ``BV = 4`` when ``B * HV <= 64``, else ``8`` (float32 state) or ``32`` (other state
  dtypes). ``BV`` is a compile-time constant of the kernel: another tile shape is another
  thread layout and another reduction order over ``K`` for the same row, so a request's
  decode bits could depend on how many requests share the step. The launcher keeps vLLM's
  choice everywhere except there, where it pins the large-batch tile (8 for a float32 state,
  32 otherwise) and recomputes the grid's first dimension, ``cdiv(V, BV)``. On Hopper vLLM's
  choice does not depend on the batch (``BV = 4`` for a float32 state, 32 otherwise) and is
  left alone. The rule is tested on CPU (``tests/batch_invariance/test_packed_decode_tile.py``,
  with vLLM's own function and a stand-in kernel); the H200 (SM90) cannot run the Blackwell
  branch, so no GPU measurement backs it.
* **Upstream**: none.
* **Remove when**: vLLM fixes the tile under batch-invariant mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1; from vLLM 0.33.0.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import GROUP

FUSED_RECURRENT_MODULE = "vllm.third_party.flash_linear_attention.ops.fused_recurrent"

PACKED_DECODE_KERNEL = SourceTarget(
    FUSED_RECURRENT_MODULE, "fused_recurrent_gated_delta_rule_packed_decode_kernel"
)
PACKED_DECODE = SourceTarget(
    FUSED_RECURRENT_MODULE, "fused_recurrent_gated_delta_rule_packed_decode"
)

BLACKWELL_FAMILY = 100
PACKED_DECODE_TILE_SINCE = "0.33.0"  # the Blackwell BV choice


def pinned_tile(bv: int, k: int, v: int, float32_state: bool, blackwell: bool) -> int:
    """The ``BV`` to launch: vLLM's ``bv``, except on Blackwell with ``K == V == 128``, where
    it is the tile vLLM picks for ``B * HV > 64`` (8 for a float32 state, else 32)."""
    if blackwell and k == v == 128:
        return 8 if float32_state else 32
    return bv


def _is_blackwell(device: Any) -> bool:
    """The platform answer vLLM's own tile choice gets (its module's ``current_platform``)."""
    platform = importlib.import_module(FUSED_RECURRENT_MODULE).current_platform
    return bool(
        platform.is_cuda()
        and platform.is_device_capability_family(
            BLACKWELL_FAMILY, device_id=getattr(device, "index", None)
        )
    )


class PinnedTileLauncher:
    """``kernel[grid](**kwargs)`` with the value tile pinned; other attributes are the kernel's."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            state = kwargs["h0"]
            bv = pinned_tile(
                kwargs["BV"],
                kwargs["K"],
                kwargs["V"],
                str(state.dtype) == "torch.float32",
                _is_blackwell(state.device),
            )
            if bv != kwargs["BV"]:
                v = kwargs["V"]
                grid_ = ((v + bv - 1) // bv, *tuple(grid)[1:])
                kwargs = {**kwargs, "BV": bv}
            else:
                grid_ = grid
            return self.kernel[grid_](*args, **kwargs)

        return launch


def make_launcher(kernel: Any) -> PinnedTileLauncher:
    return PinnedTileLauncher(kernel)


def packed_decode_patch() -> Patch:
    return Patch(
        target=PACKED_DECODE_KERNEL,
        replacement=make_launcher,
        why="Blackwell packed-decode value tile pinned, not chosen from B*HV",
        relies_on=(PACKED_DECODE,),  # launches the kernel with keyword arguments, BV from B*HV
        kind="object",
        label="blackwell-decode-tile",
        group=GROUP,
        since=PACKED_DECODE_TILE_SINCE,
    )
