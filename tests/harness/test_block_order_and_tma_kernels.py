"""The what-if kernels that ``bench_decode.py --block-order`` and ``--tma`` time write the goldens'
bits in Triton's interpreter: the block-order kernel in ours' order and rotated, the
tensor-descriptor kernel at one stage and pipelined, each with inactive rows."""

from __future__ import annotations

from .helpers import run_interpreted

# K = 16, V = 32 in blocks of 8 rows, 4 per program: with two value heads and four rows the
# rotated programs start at every block of their heads.
CHECK = """
import json, torch, triton
from gdn_evidence.harness.block_order_kernel import block_order_kernel
from gdn_evidence.harness.tma_kernel import allocate, tma_kernel
from tests.harness.interpreted_recurrent import bit_differences, recurrent_case

triton.set_allocator(allocate)
VARIANTS = {
    "in order": (block_order_kernel, {"ROTATE": False}),
    "rotated": (block_order_kernel, {"ROTATE": True}),
    "tma stages=1": (tma_kernel, {"STAGES": 1}),
    "tma stages=3": (tma_kernel, {"STAGES": 3}),
}
g = torch.Generator().manual_seed(0)
results = {}
for dtype in (torch.float32, torch.bfloat16):
    case = recurrent_case(g, dtype, 32)
    for name, (kernel, extra) in VARIANTS.items():
        def launch(grid, arguments, constexprs, kernel=kernel, extra=extra):
            kernel[grid](*arguments, **constexprs, **extra, num_warps=1)
        results[f"{name} {str(dtype)[6:]}"] = bit_differences(case, 4, launch)
print(json.dumps(results))
"""


def test_the_block_order_and_tma_kernels_write_the_goldens_bits():
    cases = run_interpreted(CHECK)
    assert len(cases) == 8
    for name, case in cases.items():
        assert case["out_bits_differ"] == 0, name
        assert case["state_bits_differ"] == 0, name
        assert case["past_out_changed"] == 0, name
        assert case["state_changed"] > 0, name  # the step did update the state
