"""The recurrent step's arithmetic (recurrent.py) against an independent float64 reference.

The reference is the same math written plainly in float64 torch ops (torch.exp, softplus,
sigmoid, sum, repeat_interleave). Each choice the golden makes (grouped head map, scale after
the norm, the softplus threshold, the norm itself) is checked by showing that the alternative
choice lands far outside the bound that the golden meets.
"""

import pytest
import torch
import torch.nn.functional as F

from vllm_gdn_invariant.golden import recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from .helpers import build_recurrent_case

# Regression bounds on max |golden - float64| / max |float64| (fp32 inputs and state), over the
# fixtures below; measured max beside each.
OUT_BOUND = 1e-6  # measured 2.1e-7 (without QK norm; 9.0e-8 with it)
STATE_BOUND = 1e-6  # measured 2.3e-7 (without QK norm; 8.7e-8 with it)


def float64_step(case, *, head_map="grouped", scale_before_norm=False):
    """The decode step in float64; returns (out [B, HV, V], new blocks [B, HV, V, K])."""
    H = case.kwargs["num_k_heads"]
    scale = case.kwargs["scale"]
    HV, V, K = case.state.shape[1:]
    x = case.mixed_qkv.double()
    q = x[:, : H * K].reshape(-1, H, K)
    k = x[:, H * K : 2 * H * K].reshape(-1, H, K)
    v = x[:, 2 * H * K :].reshape(-1, HV, V)
    if scale_before_norm:
        q = q * scale
    if case.kwargs["use_qk_l2norm"]:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if not scale_before_norm:
        q = q * scale
    if head_map == "grouped":
        q, k = q.repeat_interleave(HV // H, dim=1), k.repeat_interleave(HV // H, dim=1)
    else:
        q, k = q.repeat(1, HV // H, 1), k.repeat(1, HV // H, 1)
    g = -torch.exp(case.A_log.double()) * F.softplus(case.a.double() + case.dt_bias.double())
    beta = torch.sigmoid(case.b.double())
    h = case.state.double()[case.state_indices.long()] * torch.exp(g)[:, :, None, None]
    v = (v - (h * k[:, :, None, :]).sum(-1)) * beta[:, :, None]
    h = h + v[:, :, :, None] * k[:, :, None, :]
    return (h * q[:, :, None, :]).sum(-1), h


def max_errors(case, reference):
    """Normwise relative errors of the golden's output and new blocks against ``reference``."""
    out, state = recurrent_step(*case.args(), **case.kwargs)
    ref_out, ref_state = reference
    blocks = case.state_indices.long()
    out_error = (out[:, 0].double() - ref_out).abs().max() / ref_out.abs().max()
    state_error = (state[blocks].double() - ref_state).abs().max() / ref_state.abs().max()
    return out_error.item(), state_error.item()


def fp32_case(**overrides):
    settings = dict(H=2, HV=8, K=40, V=24, mixed_dtype=torch.float32, seed=21)
    settings.update(overrides)
    return build_recurrent_case(32, **settings)


@pytest.mark.parametrize("use_qk_l2norm", [True, False])
def test_golden_is_close_to_the_float64_step(use_qk_l2norm):
    case = fp32_case(use_qk_l2norm=use_qk_l2norm)
    out_error, state_error = max_errors(case, float64_step(case))
    assert out_error < OUT_BOUND
    assert state_error < STATE_BOUND


def test_value_heads_share_k_heads_in_groups_not_interleaved():
    case = fp32_case()
    out_error, _ = max_errors(case, float64_step(case, head_map="interleaved"))
    assert out_error > 1000 * OUT_BOUND


def test_scale_multiplies_q_after_the_norm():
    case = fp32_case()
    out_error, _ = max_errors(case, float64_step(case, scale_before_norm=True))
    assert out_error > 1000 * OUT_BOUND


def test_qk_norm_switch_changes_the_arithmetic():
    case = fp32_case()
    plain = fp32_case(use_qk_l2norm=False)
    out_error, _ = max_errors(case, float64_step(plain))
    assert out_error > 1000 * OUT_BOUND


def test_gates_around_the_softplus_threshold_are_close_to_float64():
    case = fp32_case()
    case.a = torch.full_like(case.a, 20.5)  # a + dt_bias straddles 20 across heads
    case.dt_bias = torch.linspace(-1.0, 1.0, case.dt_bias.numel())
    case.A_log = torch.full_like(case.A_log, -6.0)  # keeps exp(g) away from 0
    out_error, state_error = max_errors(case, float64_step(case))
    assert out_error < OUT_BOUND and state_error < STATE_BOUND


def test_bf16_state_is_the_fp32_result_rounded_once():
    fp32_state = build_recurrent_case(16, state_dtype=torch.float32, seed=22)
    bf16_state = build_recurrent_case(16, state_dtype=torch.float32, seed=22)
    bf16_state.state = bf16_state.state.to(torch.bfloat16)
    fp32_state.state = bf16_state.state.to(torch.float32)  # same values, fp32 storage
    _, wide = recurrent_step(*fp32_state.args(), **fp32_state.kwargs)
    out, narrow = recurrent_step(*bf16_state.args(), **bf16_state.kwargs)
    out_wide, _ = recurrent_step(*fp32_state.args(), **fp32_state.kwargs)
    assert narrow.dtype == torch.bfloat16
    assert same_bits(narrow, wide.to(torch.bfloat16))
    assert same_bits(out, out_wide)
