"""Our recurrent kernel's launch arguments as the what-if recurrent kernels take them."""

from __future__ import annotations

# kernels.recurrent's own request for the state into L2 (each what-if kernel asks in its own
# way) and its store of the outputs from the K-sum's layout (the what-if kernels store them
# with tl.store, as ours does with OUT_AS_HELD off)
OURS_ONLY = ("L2_AHEAD", "OUT_AS_HELD")


def what_if_constexprs(constexprs: dict) -> dict:
    """``kernels.recurrent.kernel_arguments``' constexprs without those only ours takes: the
    what-if kernels (prefetch, pipelined, loads-ahead, L2 prefetch) take every other one."""
    return {name: value for name, value in constexprs.items() if name not in OURS_ONLY}
