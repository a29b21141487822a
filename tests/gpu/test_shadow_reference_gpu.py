"""GPU: the golden reference by the golden-matched kernels gives the PyTorch goldens' bits on
CUDA, for a checked layer of Qwen3-Next's heads. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.shadow.pairs import snapshot_case
from vllm_gdn_invariant.shadow.bits import same_bits
from vllm_gdn_invariant.shadow.reference import (
    StateLayout,
    golden_kernels_reference,
    golden_reference,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

QWEN3_NEXT_HEADS = (16, 32, 128, 128)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim_first", [True, False], ids=["dim-first", "width-first"])
@pytest.mark.parametrize("rows", [1, 64])
def test_the_golden_kernels_reference_gives_the_goldens_bits_on_cuda(state_dtype, dim_first, rows):
    snapshot, params = snapshot_case(
        state_dtype, dim_first, torch.device("cuda"), QWEN3_NEXT_HEADS, rows=rows, seed=rows
    )
    layout = StateLayout(conv_dim_first=dim_first)
    want = golden_reference(snapshot, params, layout, torch.bfloat16)
    got = golden_kernels_reference(snapshot, params, layout, torch.bfloat16)
    for name in ("output", "recurrent_state", "conv_state"):
        assert same_bits(getattr(got, name), getattr(want, name)), name
    assert not same_bits(got.recurrent_state, snapshot.ssm_blocks)
