"""The kernels compiled for an H100/H200 (sm_90) have no contraction and no approximate function;
the replay kernel, which holds a state block in registers across tokens, spills none.

``triton.compile`` builds the kernels with their launch options for sm_90 without a GPU (Triton's
wheel ships ptxas and nvdisasm); ``codegen.contraction_report`` then checks the PTX (no fma, every
f32 add/sub/mul rounded with ``.rn``, no ``.approx``) and the SASS (every FFMA belongs to an IEEE
division or square-root expansion, and there are exactly as many as those take). Compiling the
same kernel with contraction on must fail the check, which shows the check can fail; a replay
launch shape of one warp for 128 value rows must show spills.
"""

import pytest
import torch

from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels.conv import conv_config
from vllm_gdn_invariant.kernels.replay import ReplayConfig, ReplayDims
from vllm_gdn_invariant.kernels.validation import ConvDims, RecurrentDims

pytestmark = pytest.mark.skipif(
    not codegen.nvidia_tool("nvdisasm").exists(), reason="Triton's NVIDIA tools are missing"
)

QWEN3_NEXT = RecurrentDims(64, 16, 32, 128, 128, 128**-0.5, True)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_recurrent_kernel_for_sm90_has_no_contraction(state_dtype):
    report = codegen.report_of(codegen.compile_recurrent(QWEN3_NEXT, state_dtype=state_dtype))
    assert report.clean, report
    # q, k norms, log1p, sigmoid: 6 divisions at least (a shape whose threads hold several
    # slices of q or k repeats some), 2 square roots
    assert report.ptx_div_rn >= 6 and report.ptx_sqrt_rn == 2
    # the step's arithmetic was seen (measured 409 fp32, 425 bf16 at the defaults)
    assert report.ptx_rounded_ops > 300


def test_recurrent_kernel_with_odd_dims_for_sm90_has_no_contraction():
    dims = RecurrentDims(7, 1, 3, 33, 17, 33**-0.5, False)
    report = codegen.report_of(codegen.compile_recurrent(dims, state_dtype=torch.bfloat16))
    assert report.clean, report


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
def test_conv_kernel_for_sm90_has_no_contraction(dim_first):
    dims = ConvDims(64, 8192, 4, dim_first, True)
    report = codegen.report_of(codegen.compile_conv(dims, cache_dtype=torch.bfloat16))
    assert report.clean, report
    config = conv_config(dims, interpreted=False)
    channels_per_thread = config.block_d // (32 * config.num_warps)
    assert report.ptx_div_rn == channels_per_thread  # the SiLU division of each channel


def test_the_check_fails_a_kernel_compiled_with_contraction():
    report = codegen.report_of(codegen.compile_conv(ConvDims(64, 8192, 4, True, True), fusion=True))
    assert not report.clean
    assert report.ptx_fused > 0 and report.sass_ffma_unexplained


# Qwen3-Next's heads (K = V = 128, W = 4) at TP1 and at TP4 per rank.
REPLAY_SHAPES = {
    "tp1": ReplayDims(64, 16, 32, 128, 128, 4, 128**-0.5),
    "tp4": ReplayDims(8, 4, 8, 128, 128, 4, 128**-0.5),
}


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(REPLAY_SHAPES))
def test_replay_kernel_for_sm90_has_no_contraction_and_no_spills(shape, state_dtype):
    compiled = codegen.compile_replay(REPLAY_SHAPES[shape], state_dtype=state_dtype)
    report = codegen.report_of(compiled)
    assert report.clean, report
    assert report.ptx_div_rn > 0 and report.ptx_sqrt_rn == 2
    usage = codegen.resource_usage(compiled)
    assert not usage.spills, usage


def test_the_spill_check_fails_a_replay_shape_that_spills():
    dims = ReplayDims(8, 1, 2, 32, 128, 4, 32**-0.5)
    config = ReplayConfig(block_v=128, log2_j=1, log2_cl=2, log2_vec=2, num_warps=1)
    usage = codegen.resource_usage(codegen.compile_replay(dims, config=config))
    assert usage.spills, usage
