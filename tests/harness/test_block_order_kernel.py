"""The block-order what-if kernel that ``bench_decode.py --block-order`` times: the goldens' bits
in Triton's interpreter, in ours' order and rotated, with inactive rows."""

from __future__ import annotations

from .helpers import run_interpreted

# K = 16, V = 32 in blocks of 8 rows, 4 per program: with two value heads and four rows the
# programs start at every block of their heads when rotated.
CHECK = """
import json, torch
from gdn_evidence.harness.block_order_kernel import block_order_kernel
from tests.harness.interpreted_recurrent import bit_differences, recurrent_case

g = torch.Generator().manual_seed(0)
results = {}
for dtype in (torch.float32, torch.bfloat16):
    case = recurrent_case(g, dtype, 32)
    for rotate in (False, True):
        def launch(grid, arguments, constexprs, rotate=rotate):
            block_order_kernel[grid](*arguments, **constexprs, ROTATE=rotate, num_warps=1)
        results[f"{str(dtype)[6:]} rotate={rotate}"] = bit_differences(case, 4, launch)
print(json.dumps(results))
"""


def test_the_block_order_kernel_writes_the_goldens_bits_in_either_order():
    cases = run_interpreted(CHECK)
    assert len(cases) == 4
    for name, case in cases.items():
        assert case["out_bits_differ"] == 0, name
        assert case["state_bits_differ"] == 0, name
        assert case["past_out_changed"] == 0, name
        assert case["state_changed"] > 0, name  # the step did update the state
