"""The tensor-descriptor what-if kernel that ``bench_decode.py --tma`` times: the goldens' bits in
Triton's interpreter, one stage and pipelined, with inactive rows."""

from __future__ import annotations

from .helpers import run_interpreted

# K = 16, V = 32 in blocks of 8 rows, 4 per program.
CHECK = """
import json, torch, triton
from gdn_evidence.harness.tma_kernel import tma_kernel
from tests.harness.interpreted_recurrent import bit_differences, recurrent_case

triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
g = torch.Generator().manual_seed(0)
results = {}
for dtype in (torch.float32, torch.bfloat16):
    case = recurrent_case(g, dtype, 32)
    for stages in (1, 3):
        def launch(grid, arguments, constexprs, stages=stages):
            tma_kernel[grid](*arguments, **constexprs, STAGES=stages, num_warps=1)
        results[f"{str(dtype)[6:]} stages={stages}"] = bit_differences(case, 4, launch)
print(json.dumps(results))
"""


def test_the_tma_kernel_writes_the_goldens_bits():
    cases = run_interpreted(CHECK)
    assert len(cases) == 4
    for name, case in cases.items():
        assert case["out_bits_differ"] == 0, name
        assert case["state_bits_differ"] == 0, name
        assert case["past_out_changed"] == 0, name
        assert case["state_changed"] > 0, name  # the step did update the state
