"""GPU: compare_kernel.py's one pass gives compare.py's torch statistics on CUDA, field by
field, for a checked layer's shapes. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.shadow.pairs import pair
from vllm_gdn_invariant.shadow.compare import device_stats, torch_stats
from vllm_gdn_invariant.shadow.compare_kernel import BLOCK

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[0].cpu(), b[0].cpu()) and torch.equal(
        a[1].cpu().view(torch.int64), b[1].cpu().view(torch.int64)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "n", [2112, 3 * BLOCK + 5, 64 * 32 * 128 * 128], ids=["small", "tail", "64-rows"]
)
def test_the_one_pass_equals_the_torch_ops_on_cuda(dtype, n):
    served, reference = pair(dtype, n, seed=n)
    served, reference = served.cuda(), reference.cuda()
    fused = device_stats(served, reference)
    assert same(fused, torch_stats(served, reference))
    assert same(fused, torch_stats(served.cpu(), reference.cpu()))
