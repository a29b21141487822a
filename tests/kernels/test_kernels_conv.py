"""The conv-update kernel gives the golden's bits, interpreted on CPU tensors.

``out`` and the conv state, updated in place, are compared on bit views with
``golden.conv_update``: every combination of cache, x and weight dtype, with and without bias
and SiLU ("silu" and "swish"), both cache layouts, widths 2 to 5, an odd channel count, inactive
rows, strided inputs, a state inside a wider buffer and accumulators at -0 and below -88.72.
"""

import itertools

import pytest
import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_conv_case

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_CASES = list(itertools.product(DTYPES, DTYPES, DTYPES))  # cache, x, weight


def assert_matches_golden(kernels, case):
    golden_out, golden_state = golden_conv_update(*case.args(), **case.kwargs)
    state = case.conv_state.clone()
    out = kernels.conv_update(case.x, state, case.weight, case.state_indices, **case.kwargs)
    assert same_bits(out, golden_out), "out differs from the golden's"
    assert same_bits(state, golden_state), "the updated conv state differs from the golden's"


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtypes", DTYPE_CASES, ids=["-".join(d) for d in DTYPE_CASES])
def test_conv_update_gives_the_goldens_bits(kernels, dtypes, with_bias, activation, dim_first):
    cache, x, weight = (DTYPES[d] for d in dtypes)
    case = build_conv_case(
        5,
        dim=37,
        cache_dtype=cache,
        x_dtype=x,
        weight_dtype=weight,
        with_bias=with_bias,
        activation=activation,
        dim_first=dim_first,
        inactive=(1, 3),
        seed=len(dtypes[0]) + 7 * with_bias,
    )
    assert_matches_golden(kernels, case)


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
@pytest.mark.parametrize("width", [2, 3, 5])
def test_conv_widths_give_the_goldens_bits(kernels, width, dim_first):
    case = build_conv_case(
        3, dim=19, W=width, with_bias=True, activation="swish", dim_first=dim_first, inactive=(2,)
    )
    assert_matches_golden(kernels, case)


def test_strided_inputs_and_a_state_inside_a_wider_buffer(kernels):
    case = build_conv_case(4, dim=21, cache_dtype=torch.float32, with_bias=True, inactive=(0,))
    case.x = case.x.t().contiguous().t()
    case.weight = case.weight.t().contiguous().t()
    buffer = torch.randn(case.conv_state.shape[0], 21, 5, generator=torch.Generator())
    buffer[..., :3] = case.conv_state
    case.conv_state = buffer[..., :3]
    before = buffer.clone()
    golden_out, golden_state = golden_conv_update(*case.args(), **case.kwargs)
    out = kernels.conv_update(*case.args(), **case.kwargs)
    assert same_bits(out, golden_out)
    assert same_bits(case.conv_state, golden_state)
    assert same_bits(buffer[..., 3:], before[..., 3:]), "wrote outside the state's view"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy warns where exp overflows to inf
def test_accumulators_at_signed_zero_and_far_below_zero(kernels):
    case = build_conv_case(4, dim=8, cache_dtype=torch.float32, x_dtype=torch.float32)
    case.weight = case.weight.float()
    case.kwargs["bias"] = torch.tensor([-0.0, 0.0, -0.0, 1.0, -200.0, -88.72, -88.73, 90.0])
    case.x[0] = -0.0
    case.conv_state[int(case.state_indices[0])] = -0.0  # acc = bias + (-0) products
    case.x[1] = 1e30
    case.conv_state[int(case.state_indices[1])] = -1e30
    assert_matches_golden(kernels, case)


def test_conv_state_is_updated_in_place_and_only_in_the_active_blocks(kernels):
    case = build_conv_case(4, dim=6, dim_first=False)
    case.state_indices = torch.tensor([3, -1, 0, 7], dtype=torch.int32)
    state = case.conv_state
    before = state.clone()
    out = kernels.conv_update(*case.args(), **case.kwargs)
    assert case.conv_state is state
    changed = (state.view(torch.int16) != before.view(torch.int16)).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() == [3, 7]
    assert not bool(out[[1, 2]].any())


def test_empty_batch_returns_an_empty_out(kernels):
    case = build_conv_case(0, dim=6)
    out = kernels.conv_update(*case.args(), **case.kwargs)
    assert out.shape == (0, 6)


def test_default_launch_shapes_on_a_gpu_follow_the_cache_layout(kernels):
    """The GPU's launch shape at Qwen3-Next's 8192 channels: with a state-first cache (vLLM's
    default layout) 512 channels over 8 warps at every batch size; with a dim-first one 128
    over 4 warps below 64 rows and 256 over 8 from there."""
    shape = kernels.conv.ConvConfig

    def config(batch: int, dim_first: bool):
        dims = kernels.validation.ConvDims(batch, 8192, 4, dim_first, True)
        return kernels.conv.conv_config(dims, interpreted=False)

    for batch in (1, 16, 63, 64, 1024):
        assert config(batch, dim_first=False) == shape(512, 8)
    for batch in (1, 16, 63):
        assert config(batch, dim_first=True) == shape(128, 4)
    for batch in (64, 1024):
        assert config(batch, dim_first=True) == shape(256, 8)
