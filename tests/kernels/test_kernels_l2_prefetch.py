"""The recurrent kernel asks each block of state rows into L2 one iteration before it loads it
(L2_AHEAD) exactly where ``recurrent.l2_ahead`` says: a program of two or more blocks, sm_90 or
later, compiled, the state's rows contiguous and 16-byte aligned. The rule is checked on
layouts that break each condition, and the compiled kernel (sm_90 and sm_80, without a GPU) is
counted for its bulk prefetches. The prefetch changes no value: the interpreter tests skip it,
and tests/gpu/test_kernels_bitwise.py checks the goldens' bits with it on a GPU."""

import pytest
import torch

from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.recurrent import RecurrentConfig, l2_ahead, recurrent_config
from vllm_gdn_invariant.kernels.validation import RecurrentDims

H, HV, K, V = 16, 32, 128, 128
CHUNKED = RecurrentConfig(block_v=16, log2_j=0, log2_cl=3, log2_vec=3, num_warps=2, chunks=8)
ONE_BLOCK = RecurrentConfig(block_v=8, log2_j=0, log2_cl=2, log2_vec=3, num_warps=1, chunks=1)
PREFETCH_PTX = "cp.async.bulk.prefetch.L2.global"


def dims(batch: int) -> RecurrentDims:
    return RecurrentDims(batch, H, HV, K, V, K**-0.5, True)


def state(dtype: torch.dtype = torch.bfloat16, *, pad_k: int = 0, blocks: int = 4) -> torch.Tensor:
    """A state [blocks, HV, V, K], rows of K + pad_k elements (the pad unused)."""
    return torch.zeros(blocks, HV, V, K + pad_k, dtype=dtype)[..., :K]


def test_the_prefetch_is_on_for_a_program_of_several_blocks_on_sm90():
    assert l2_ahead(state(), CHUNKED, 90, interpreted=False)
    assert l2_ahead(state(), CHUNKED, 100, interpreted=False)  # Blackwell
    assert l2_ahead(state(torch.float32), CHUNKED, 90, interpreted=False)


@pytest.mark.parametrize(
    "why, config, capability, interpreted",
    [
        ("one block per program", ONE_BLOCK, 90, False),
        ("no bulk prefetch before sm_90", CHUNKED, 80, False),
        ("interpreted", CHUNKED, 90, True),
    ],
)
def test_the_prefetch_is_off(why, config, capability, interpreted):
    assert not l2_ahead(state(), config, capability, interpreted=interpreted), why


@pytest.mark.parametrize(
    "why, layout",
    [
        ("base 8 bytes off", lambda: torch.zeros(4 * HV * V * K + 4, dtype=torch.bfloat16)[4:]
         .view(4, HV, V, K)),
        ("rows 8 bytes longer than K", lambda: state(pad_k=4)),
        ("rows not contiguous",
         lambda: torch.zeros(4, HV, V, 2 * K, dtype=torch.bfloat16)[..., ::2]),
        ("blocks 8 bytes apart past a whole number of heads",
         lambda: torch.zeros(4, HV * V * K + 4, dtype=torch.bfloat16)[:, :HV * V * K]
         .view(4, HV, V, K)),
    ],
)  # fmt: skip
def test_the_prefetch_is_off_for_a_misaligned_state(why, layout):
    misaligned = layout()
    assert misaligned.shape == (4, HV, V, K), why
    assert not l2_ahead(misaligned, CHUNKED, 90, interpreted=False), why


def test_the_rule_follows_the_default_launch_shapes():
    """bf16 from B = 16 (programs of several blocks) at 32 value heads; fp32 never."""
    for batch, dtype, expected in [
        (1, torch.bfloat16, False),
        (8, torch.bfloat16, False),
        (16, torch.bfloat16, True),
        (1024, torch.bfloat16, True),
        (1024, torch.float32, False),
    ]:
        config = recurrent_config(dims(batch), dtype, interpreted=False)
        assert l2_ahead(state(dtype), config, 90, interpreted=False) is expected, (batch, dtype)


def kernel_arguments_for(state_tensor: torch.Tensor, capability: int | None) -> dict:
    batch = 2
    mixed = torch.zeros(batch, 2 * H * K + HV * V, dtype=torch.bfloat16)
    gates = torch.zeros(batch, HV, dtype=torch.bfloat16)
    _, _, constexprs = recurrent_kernel.kernel_arguments(
        mixed,
        gates,
        gates,
        torch.zeros(HV),
        torch.zeros(HV),
        torch.zeros(batch, 1, HV, V, dtype=torch.bfloat16),
        state_tensor,
        torch.zeros(batch, dtype=torch.int32),
        dims(batch),
        CHUNKED,
        capability,
    )
    return constexprs


@pytest.mark.skipif(recurrent_kernel.INTERPRETED, reason="the rule is off when interpreted")
def test_the_launch_arguments_carry_the_rule_for_the_target():
    assert kernel_arguments_for(state(), 90)["L2_AHEAD"] is True
    assert kernel_arguments_for(state(), 80)["L2_AHEAD"] is False
    assert kernel_arguments_for(state(pad_k=4), 90)["L2_AHEAD"] is False
    assert kernel_arguments_for(state(), None)["L2_AHEAD"] is False  # a CPU state: no target


needs_nvidia_tools = pytest.mark.skipif(
    not codegen.nvidia_tool("nvdisasm").exists() or recurrent_kernel.INTERPRETED,
    reason="compiles for the GPU without one: Triton's NVIDIA tools, not interpreted",
)


@needs_nvidia_tools
@pytest.mark.parametrize(
    "batch, dtype, capability, prefetches",
    [
        (128, torch.bfloat16, 90, 2),  # one before the loop, one at the top of each iteration
        (128, torch.bfloat16, 80, 0),
        (1, torch.bfloat16, 90, 0),  # one block per program
        (128, torch.float32, 90, 0),
    ],
)
def test_the_compiled_kernel_has_the_prefetches_the_rule_asks(batch, dtype, capability, prefetches):
    compiled = codegen.compile_recurrent(dims(batch), state_dtype=dtype, capability=capability)
    assert compiled.asm["ptx"].count(PREFETCH_PTX) == prefetches
    assert codegen.sass_of(compiled.asm["cubin"]).count("UBLKPF.L2") == prefetches
    assert codegen.report_of(compiled).clean
