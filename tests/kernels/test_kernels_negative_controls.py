"""Wrong kernels fail the bitwise comparison (negative controls of the kernel tests).

Each test swaps one building block of the interpreted kernels for a plausible wrong one (a sum
in another order, Triton's exp, an exp with fused multiply-adds, vLLM's SiLU) through
monkeypatch, which restores it afterwards, and requires the comparison with the golden to see a
difference. The last test shows the same for the fused exp alone, against the golden's exp.
"""

import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import elementary as golden_elementary
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_conv_case, build_recurrent_case


def recurrent_matches_golden(kernels, case) -> bool:
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)
    state = case.state.clone()
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state, case.state_indices)
    out = kernels.recurrent_step(*args, **case.kwargs)
    return same_bits(out, golden_out) and same_bits(state, golden_state)


def recurrent_case():
    return build_recurrent_case(3, H=2, HV=4, K=33, V=6, inactive=(1,), seed=21)


def test_the_unchanged_kernel_matches(kernels):
    assert recurrent_matches_golden(kernels, recurrent_case())


def test_a_kernel_summing_in_another_order_fails(kernels, probes, monkeypatch):
    monkeypatch.setattr(kernels.recurrent, "fixed_order_sum_slabs", probes.sequential_sum)
    assert not recurrent_matches_golden(kernels, recurrent_case())


def test_a_kernel_with_tritons_exp_fails(kernels, probes, monkeypatch):
    monkeypatch.setattr(kernels.recurrent, "exp", probes.hardware_exp)
    assert not recurrent_matches_golden(kernels, recurrent_case())


def fused_exp_differs(probes, x: torch.Tensor) -> torch.Tensor:
    """Where the fused exp of probes.py and the golden exp differ (about 1% of inputs)."""
    y = torch.empty_like(x)
    probes.apply_unary[(1,)](x, y, x.numel(), FUNCTION=probes.contracted_exp, BLOCK=x.numel())
    return y.view(torch.int32) != golden_elementary.exp_forward(x).view(torch.int32)


def test_a_kernel_with_fused_multiply_adds_fails(kernels, probes, monkeypatch):
    case = recurrent_case()
    candidates = torch.linspace(-1.0, 2.0, 1 << 12)
    case.A_log = candidates[fused_exp_differs(probes, candidates)][:4]  # exp(A_log) differs
    assert recurrent_matches_golden(kernels, case)
    monkeypatch.setattr(kernels.recurrent, "exp", probes.contracted_exp)
    assert not recurrent_matches_golden(kernels, case)


def test_a_conv_kernel_with_vllms_silu_fails(kernels, probes, monkeypatch):
    case = build_conv_case(5, dim=64, cache_dtype=torch.float32, x_dtype=torch.float32)
    golden_out, _ = golden_conv_update(*case.args(), **case.kwargs)
    monkeypatch.setattr(kernels.conv, "silu", probes.approximate_silu)
    out = kernels.conv_update(case.x, case.conv_state.clone(), case.weight, case.state_indices)
    assert not same_bits(out, golden_out)


def test_fusing_the_multiply_adds_of_exp_changes_its_bits(probes):
    assert int(fused_exp_differs(probes, torch.linspace(-100.0, 88.0, 1 << 14)).sum()) > 100
