"""GPU: compare_kernel.py's one pass gives compare.py's torch statistics on CUDA, field by
field, for a checked layer's shapes. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.shadow.pairs import pair
from vllm_gdn_invariant.shadow.compare import STATS_WIDTH, device_stats, torch_stats
from vllm_gdn_invariant.shadow.compare_kernel import BLOCK

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def row(stats_of, served: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """One field's statistics row (int64, the float max |diff| as its bits) on the host."""
    out = torch.zeros(STATS_WIDTH, dtype=torch.int64, device=served.device)
    stats_of(served, reference, out)
    return out.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "n", [2112, 3 * BLOCK + 5, 64 * 32 * 128 * 128], ids=["small", "tail", "64-rows"]
)
def test_the_one_pass_equals_the_torch_ops_on_cuda(dtype, n):
    served, reference = pair(dtype, n, seed=n)
    served, reference = served.cuda(), reference.cuda()
    fused = row(device_stats, served, reference)
    assert fused == row(torch_stats, served, reference)
    assert fused == row(torch_stats, served.cpu(), reference.cpu())
    assert fused[0] > 0 and fused[2] == 1  # differences and one NaN mismatch to count
