"""The conv update's arithmetic (conv.py), pinned by fixtures on which the alternatives differ.

Each fixture's expected value is computed here step by step in numpy float32 (with bf16
rounding written out on the bit pattern), next to the alternative behaviour, which must give
a different answer on the same fixture.
"""

import numpy as np
import pytest
import torch

from vllm_gdn_invariant.golden import conv_update, silu
from vllm_gdn_invariant.shadow.bits import same_bits

from .helpers import build_conv_case

F32 = np.float32


def round_to_bf16(value: float) -> np.float32:
    """Round an fp32 value to the nearest bf16 (ties to even), on its bit pattern."""
    bits = int(np.array([value], dtype=np.float32).view(np.uint32)[0])
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def one_channel(history, token, weight, dtype, bias=None):
    """conv_update on one row and one channel; returns (out, new state) as Python floats."""
    conv_state = torch.tensor([[[0.0] * len(history)], [history]], dtype=dtype)  # block 0 is null
    kwargs = {"activation": None}
    if bias is not None:
        kwargs["bias"] = torch.tensor([bias], dtype=dtype)
    out, new_state = conv_update(
        torch.tensor([[token]], dtype=dtype),
        conv_state,
        torch.tensor([weight], dtype=dtype),
        torch.tensor([1], dtype=torch.int32),
        **kwargs,
    )
    return out.item(), new_state[1, 0].tolist()


def test_bias_is_the_accumulators_starting_value():
    e = 2.0**-24
    history, token, weight, bias = [e, e, 0.0], 0.0, [1.0, 1.0, 1.0, 1.0], 1.0
    bias_first = F32(bias)
    for x, w in zip([*history, token], weight, strict=True):
        bias_first = bias_first + F32(x) * F32(w)
    bias_last = F32(0.0)
    for x, w in zip([*history, token], weight, strict=True):
        bias_last = bias_last + F32(x) * F32(w)
    bias_last = bias_last + F32(bias)
    assert bias_first == F32(1.0) and bias_last == F32(1.0 + 2.0**-23)  # the fixture discriminates
    out, _ = one_channel(history, token, weight, torch.float32, bias=bias)
    assert out == float(bias_first)


def test_bf16_tap_products_are_rounded_to_bf16_before_accumulation():
    c = 1.0 + 2.0**-7  # c * c = 1 + 2^-6 + 2^-14 is not a bf16 value
    history, token, weight = [c, -(1.0 + 2.0**-6), 0.0], 0.0, [c, 1.0, 1.0, 1.0]
    rounded = F32(0.0)
    unrounded = F32(0.0)
    for x, w in zip([*history, token], weight, strict=True):
        rounded = rounded + round_to_bf16(F32(x) * F32(w))
        unrounded = unrounded + F32(x) * F32(w)
    assert rounded == F32(0.0) and round_to_bf16(unrounded) == F32(2.0**-14)
    out, _ = one_channel(history, token, weight, torch.bfloat16)
    assert out == float(round_to_bf16(rounded))


def test_taps_are_added_oldest_first():
    e = 2.0**-24
    history, token, weight = [1.0, e, e], -1.0, [1.0, 1.0, 1.0, 1.0]
    in_order = F32(0.0)
    for x in [*history, token]:
        in_order = in_order + F32(x)
    reversed_order = F32(0.0)
    for x in reversed([*history, token]):
        reversed_order = reversed_order + F32(x)
    assert in_order == F32(0.0) and reversed_order == F32(2.0**-23)
    out, _ = one_channel(history, token, weight, torch.float32)
    assert out == float(in_order)


def test_new_state_is_the_window_shifted_by_one_with_the_token_in_the_cache_dtype():
    token = 1.0 + 2.0**-10  # not a bf16 value: the cache keeps it rounded
    history = [0.5, -2.0, 3.0]
    _, new_state = one_channel(history, token, [1.0, 1.0, 1.0, 1.0], torch.float32)
    assert new_state == [-2.0, 3.0, token]
    case = build_conv_case(1, cache_dtype=torch.bfloat16, x_dtype=torch.float32, seed=1)
    case.x[0, 0] = token
    _, new_conv_state = conv_update(*case.args(), **case.kwargs)
    block = int(case.state_indices[0])
    expected = torch.cat(
        [case.conv_state[block, :, 1:], case.x[0].to(torch.bfloat16)[:, None]], dim=1
    )
    assert same_bits(new_conv_state[block], expected)
    assert new_conv_state[block, 0, -1].item() == float(round_to_bf16(F32(token)))


def test_output_is_rounded_once_to_x_dtype_not_through_the_cache_dtype():
    # fp32 x with a bf16 cache: vLLM stores acc in the cache dtype first; the golden does not.
    case = build_conv_case(
        16, cache_dtype=torch.bfloat16, x_dtype=torch.float32, activation=None, seed=2
    )
    out, _ = conv_update(*case.args(), **case.kwargs)
    through_cache = out.to(torch.bfloat16).to(torch.float32)
    assert out.dtype == torch.float32
    assert not same_bits(out, through_cache)


def test_silu_is_applied_to_the_fp32_accumulator():
    case = build_conv_case(8, cache_dtype=torch.float32, x_dtype=torch.float32, seed=3)
    out, _ = conv_update(*case.args(), **case.kwargs)
    pre, _ = conv_update(*case.args(), **{**case.kwargs, "activation": None})
    swish, _ = conv_update(*case.args(), **{**case.kwargs, "activation": "swish"})
    assert same_bits(out, silu(pre))
    assert same_bits(swish, out)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_both_state_layouts_give_the_same_bits(cache_dtype):
    first = build_conv_case(9, cache_dtype=cache_dtype, with_bias=True, seed=4, inactive=(2,))
    out, state = conv_update(*first.args(), **first.kwargs)
    last_conv_state = first.conv_state.transpose(1, 2).contiguous()
    out_t, state_t = conv_update(
        first.x,
        last_conv_state,
        first.weight,
        first.state_indices,
        **{**first.kwargs, "dim_first": False},
    )
    assert same_bits(out_t, out)
    assert same_bits(state_t.transpose(1, 2), state)


def float64_conv(case) -> torch.Tensor:
    """The same convolution in float64 with torch ops (sum over taps, torch.sigmoid)."""
    history = case.conv_state.double()[case.state_indices.long()]
    window = torch.cat([history, case.x.double()[:, :, None]], dim=2)
    acc = (window * case.weight.double()).sum(-1)
    if "bias" in case.kwargs:
        acc = acc + case.kwargs["bias"].double()
    return acc * torch.sigmoid(acc)


def test_fp32_conv_is_close_to_a_float64_reference():
    case = build_conv_case(
        64,
        dim=256,
        cache_dtype=torch.float32,
        x_dtype=torch.float32,
        weight_dtype=torch.float32,
        with_bias=True,
        seed=5,
    )
    out, _ = conv_update(*case.args(), **case.kwargs)
    error = (out.double() - float64_conv(case)).abs().max().item()
    assert error < 2e-6  # regression bound; measured 8.5e-7 (outputs up to 6.9)
