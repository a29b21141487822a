"""An autotuned toy reduction whose bits depend on its tile, for the pin's tests (imported under
Triton's interpreter by ``test_autotune_pin.py``)."""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.heuristics({"N_IS_EVEN": lambda args: args["n"] % 2 == 0})
@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 16}, num_warps=2, num_stages=3),
        triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2),
        triton.Config({"BLOCK": 128}, num_warps=4, num_stages=2),
    ],
    key=["n"],
)
@triton.jit
def tile_sum_kernel(x, out, n, BLOCK: tl.constexpr, N_IS_EVEN: tl.constexpr):
    # Core builtins only: the interpreter refuses triton.language's compiled helpers.
    total = tl.load(out)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        total += tl.reduce(tl.load(x + offsets, mask=offsets < n, other=0.0), 0, _add)
    tl.store(out, total)
