"""The recurrent kernel asks each block after a program's next into L2 where a program takes
several blocks, on sm_90 or later, for a state whose rows the bulk prefetch can address; nowhere
else.

``recurrent.l2_ahead`` decides it per launch (meta tensors here: their strides and alignment are
what it reads); the kernel compiled for sm_90 at Qwen3-Next's bf16 default shape for B >= 32
(8 blocks per program) holds the two prefetches (one before the loop, one in it), and compiled
for sm_80, or at a shape of one block per program, none. Bits are not at stake: the prefetch
moves no value (the GPU matrix and the interpreter tests check the bits).
"""

import pytest
import torch

from vllm_gdn_invariant.kernels import codegen, recurrent
from vllm_gdn_invariant.kernels.validation import RecurrentDims

PREFETCH_PTX = "cp.async.bulk.prefetch.L2.global"
BLOCKS, HV, V, K = 64, 32, 128, 128


def qwen3_next(batch: int) -> RecurrentDims:
    return RecurrentDims(batch, 16, HV, K, V, K**-0.5, True)


def meta_state(dtype: torch.dtype = torch.bfloat16, strides: tuple | None = None) -> torch.Tensor:
    if strides is None:
        return torch.empty((BLOCKS, HV, V, K), dtype=dtype, device="meta")
    return torch.empty_strided((BLOCKS, HV, V, K), strides, dtype=dtype, device="meta")


SEVERAL_BLOCKS = recurrent.RecurrentConfig(16, 0, 5, 3, 2, chunks=8)


def test_the_prefetch_goes_with_several_blocks_per_program_on_sm90_and_later():
    state = meta_state()
    assert recurrent.l2_ahead(state, SEVERAL_BLOCKS, 90)
    assert recurrent.l2_ahead(state, SEVERAL_BLOCKS, 100)
    assert not recurrent.l2_ahead(state, SEVERAL_BLOCKS, 89)
    one_block = recurrent.RecurrentConfig(16, 0, 5, 3, 2, chunks=1)
    assert not recurrent.l2_ahead(state, one_block, 90)


@pytest.mark.parametrize(
    "strides",
    [
        (HV * V * 2 * K, V * 2 * K, 2 * K, 2),  # rows not contiguous
        (HV * V * K + 4, V * K, K, 1),  # blocks 8 bytes apart modulo 16
        (HV * (V * K + 4), V * K + 4, K, 1),  # heads 8 bytes apart modulo 16
        (HV * V * (K + 4), V * (K + 4), K + 4, 1),  # rows 8 bytes apart modulo 16
    ],
    ids=["k_stride", "block_stride", "head_stride", "row_stride"],
)
def test_no_prefetch_where_a_row_range_is_not_16_byte_aligned(strides):
    assert recurrent.l2_ahead(meta_state(strides=strides), SEVERAL_BLOCKS, 90) is False
    padded = (HV * V * (K + 8), V * (K + 8), K + 8, 1)  # 16 bytes of padding per row: aligned
    assert recurrent.l2_ahead(meta_state(strides=padded), SEVERAL_BLOCKS, 90) is True


def test_a_state_off_the_gpu_gets_no_prefetch():
    state = torch.empty((2, HV, V, K), dtype=torch.bfloat16)
    assert recurrent.device_capability(state) == 0
    assert not recurrent.kernel_arguments(*(state,) * 8, qwen3_next(1), SEVERAL_BLOCKS)[2][
        "L2_AHEAD"
    ]


@pytest.mark.skipif(
    not codegen.nvidia_tool("nvdisasm").exists(), reason="Triton's NVIDIA tools are missing"
)
@pytest.mark.parametrize(
    ("batch", "state_dtype", "capability", "prefetches"),
    [
        (128, torch.bfloat16, 90, 2),
        (32, torch.bfloat16, 90, 2),
        (128, torch.bfloat16, 80, 0),
        (1, torch.bfloat16, 90, 0),  # one block per program
        (128, torch.float32, 90, 0),  # fp32 shapes take one block per program
    ],
    ids=["bf16_b128_sm90", "bf16_b32_sm90", "bf16_b128_sm80", "bf16_b1_sm90", "fp32_b128_sm90"],
)
def test_the_compiled_kernel_holds_the_prefetches_where_the_rule_says(
    batch, state_dtype, capability, prefetches
):
    dims = qwen3_next(batch)
    config = recurrent.recurrent_config(dims, state_dtype, interpreted=False)
    assert (config.chunks > 1) is (state_dtype == torch.bfloat16 and batch >= 32)
    compiled = codegen.compile_recurrent(dims, state_dtype=state_dtype, capability=capability)
    assert compiled.asm["ptx"].count(PREFETCH_PTX) == prefetches
    assert codegen.sass_of(compiled.asm["cubin"]).count("UBLKPF.L2") == prefetches
    assert codegen.report_of(compiled).clean
