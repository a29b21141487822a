"""``kernels.serving.decode_step``: vLLM's tensors in, the goldens' bits out, no host reads."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from .conftest import INTERPRETED_KERNELS

H, HV, K, V, W = 2, 4, 24, 20, 4  # K and V off the 32 grid


@pytest.fixture(scope="module")
def serving(kernels):
    return importlib.import_module(f"{INTERPRETED_KERNELS}.serving")


def make_step(state_dtype, dim_first, batch=5, blocks=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = 2 * H * K + HV * V

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    conv_shape = (blocks, dim, W - 1) if dim_first else (blocks, W - 1, dim)
    return dict(
        x=randn(batch, dim),
        a=randn(batch, HV),
        b=randn(batch, HV),
        A_log=randn(HV, dtype=torch.float32, scale=0.5),
        dt_bias=randn(HV, dtype=torch.float32, scale=0.5),
        conv_state=randn(*conv_shape, scale=0.3),
        conv_weight=randn(dim, W, scale=0.3),
        conv_bias=randn(dim, scale=0.1),
        state=randn(blocks, HV, V, K, dtype=state_dtype, scale=0.05),
        # vLLM pads with -1 (PAD_SLOT_ID) or 0 (the null block): both inactive.
        state_indices=torch.tensor([3, -1, 7, 0, 1][:batch], dtype=torch.int32),
    )


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dim_first", [True, False], ids=["dim-first", "state-first"])
def test_decode_step_gives_the_goldens_conv_then_recurrent_bits(serving, state_dtype, dim_first):
    step = make_step(state_dtype, dim_first)
    scale = K**-0.5
    conv_out, conv_state = golden_conv_update(
        step["x"],
        step["conv_state"],
        step["conv_weight"],
        step["state_indices"],
        bias=step["conv_bias"],
        activation="silu",
        dim_first=dim_first,
    )
    want_out, want_state = golden_recurrent_step(
        conv_out,
        step["a"],
        step["b"],
        step["A_log"],
        step["dt_bias"],
        step["state"],
        step["state_indices"],
        num_k_heads=H,
        scale=scale,
    )
    got = {k: v.clone() for k, v in step.items()}
    out = serving.decode_step(
        got["x"],
        got["a"],
        got["b"],
        got["A_log"],
        got["dt_bias"],
        got["conv_state"],
        got["conv_weight"],
        got["conv_bias"],
        got["state"],
        got["state_indices"],
        num_k_heads=H,
        scale=scale,
        activation="silu",
        dim_first=dim_first,
    )
    assert same_bits(out, want_out)
    assert same_bits(got["state"], want_state)
    assert same_bits(got["conv_state"], conv_state)


def test_decode_step_differs_from_the_goldens_without_the_conv(serving):
    """Negative control: skipping the conv (feeding x to the recurrent step) is caught."""
    step = make_step(torch.float32, True)
    scale = K**-0.5
    want_out, _ = golden_recurrent_step(
        step["x"],
        step["a"],
        step["b"],
        step["A_log"],
        step["dt_bias"],
        step["state"],
        step["state_indices"],
        num_k_heads=H,
        scale=scale,
    )
    out = serving.decode_step(
        step["x"],
        step["a"],
        step["b"],
        step["A_log"],
        step["dt_bias"],
        step["conv_state"],
        step["conv_weight"],
        step["conv_bias"],
        step["state"],
        step["state_indices"],
        num_k_heads=H,
        scale=scale,
    )
    assert not same_bits(out, want_out)


def test_decode_plans_keep_a_negative_zero_scale_apart(serving):
    plans = [serving.decode_plan(2, 64, 4, True, True, 2, 4, 8, 8, s, math.copysign(1.0, s),
                                 torch.float32) for s in (0.0, -0.0)]  # fmt: skip
    assert [math.copysign(1.0, plan[2].scale) for plan in plans] == [1.0, -1.0]
