"""Wrong kernels fail the bitwise comparison (negative controls of the kernel tests).

Each test swaps one building block of the interpreted kernels for a plausible wrong one (a sum
in another order, Triton's exp, an exp with fused multiply-adds, vLLM's SiLU) through
monkeypatch, which restores it afterwards, and requires the comparison with the golden to see a
difference. One test shows the same for the fused exp alone, against the golden's exp.
Kernels with one line of the loop over blocks of value rows changed (the state pointer or v not
moved to the next block, the same block loaded again) fail too.
"""

import pytest
import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import elementary as golden_elementary
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_conv_case, build_recurrent_case
from .conftest import INTERPRETED_KERNELS, KERNELS_DIR, import_interpreted


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


# Kernels that take their blocks of value rows wrongly: each replaces one line of the kernel's
# loop over blocks (the line must be there, or the test fails).
BLOCK_MUTATIONS = {
    "state_pointer_kept": ("p_h += BV * stride_state_v", "p_h += 0 * stride_state_v"),
    "v_kept": ("            v = v_next\n", "            v = v\n"),
    "same_block_prefetched": (
        "step = tl.where(i_c + 1 < CHUNKS, BV, 0)",
        "step = tl.where(i_c + 1 < CHUNKS, 0, 0)",
    ),
}


@pytest.mark.parametrize("mutation", list(BLOCK_MUTATIONS))
def test_a_kernel_that_takes_its_blocks_wrongly_fails(kernels, mutation, tmp_path):
    old, new = BLOCK_MUTATIONS[mutation]
    source = (KERNELS_DIR / "recurrent.py").read_text()
    assert source.count(old) == 1, f"the kernel no longer has {old!r}"
    path = tmp_path / f"recurrent_{mutation}.py"
    path.write_text(source.replace(old, new))
    mutated = import_interpreted(f"{INTERPRETED_KERNELS}.recurrent_{mutation}", path)
    case = build_recurrent_case(2, H=1, HV=2, K=8, V=16, inactive=(1,), seed=5)
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)

    def matches(module) -> bool:
        state = case.state.clone()
        args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state)
        dims = kernels.validation.check_recurrent_args(
            *args, case.state_indices, **case.kwargs, interpreted=True
        )
        config = module.RecurrentConfig(4, 1, 1, 1, num_warps=1, chunks=4)  # 16 rows whole
        out, _ = module.launch_recurrent(*args, case.state_indices, dims, config)
        return same_bits(out, golden_out) and same_bits(state, golden_state)

    assert matches(kernels.recurrent)
    assert not matches(mutated)
