"""The public kernels' host path on a GPU (skipped without CUDA): no host sync once an index
tensor's values are checked, and direct launches of the compiled kernels with the goldens' bits.

``torch.cuda.set_sync_debug_mode("error")`` turns every synchronizing CUDA operation into an
error: the first call with a fresh index tensor raises under it (its values are read back: the
negative control), a later call with the same tensor does not. Repeated calls with one launch
key run the compiled kernel directly (``kernels.launch.Launcher``); their results are compared
with the goldens' on bit views, for aligned and misaligned (offset) inputs, each its own key.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.kernels import conv_update, recurrent_step
from vllm_gdn_invariant.kernels.call_plans import CALL_PLANS
from vllm_gdn_invariant.kernels.conv import LAUNCH_CONV, conv_config, launch_conv
from vllm_gdn_invariant.kernels.recurrent import (
    LAUNCH_RECURRENT,
    launch_recurrent,
    recurrent_config,
)
from vllm_gdn_invariant.kernels.validation import check_conv_args, check_recurrent_args
from vllm_gdn_invariant.shadow.bits import differ, same_bits

from .test_kernels_bitwise import conv_inputs, recurrent_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@contextlib.contextmanager
def syncs_are_errors():
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@pytest.mark.parametrize("batch", [1, 64])
def test_a_call_with_checked_indices_makes_no_host_sync(batch):
    args, kwargs = recurrent_inputs(batch, 16, 32, 128, 128, torch.bfloat16, seed=batch)
    conv_args, bias = conv_inputs(batch, 8192, torch.bfloat16, True, False, seed=batch)
    conv_args = (*conv_args[:3], args[6])  # one index tensor for both ops, as in a step
    torch.cuda.synchronize()
    with syncs_are_errors(), pytest.raises(RuntimeError):
        recurrent_step(*args, **kwargs)  # fresh indices: their values are read back
    recurrent_step(*args, **kwargs)
    conv_update(*conv_args)
    torch.cuda.synchronize()
    with syncs_are_errors():
        for _ in range(3):
            conv_update(*conv_args)
            recurrent_step(*args, **kwargs)
    torch.cuda.synchronize()


def offset(tensor: torch.Tensor, elements: int) -> torch.Tensor:
    """The same values in a buffer ``elements`` further on (a data pointer off 16 bytes)."""
    if elements == 0:
        return tensor
    flat = torch.empty(tensor.numel() + elements, dtype=tensor.dtype, device=tensor.device)
    view = flat[elements:].view(tensor.shape)
    view.copy_(tensor)
    return view


@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_direct_launches_of_the_recurrent_kernel_give_the_goldens_bits(state, shift):
    state_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[state]
    args, kwargs = recurrent_inputs(64, 16, 32, 128, 128, state_dtype, seed=11 + shift)
    args = (offset(args[0], shift), *args[1:])
    checked = check_recurrent_args(*args, **kwargs, interpreted=False)
    config = recurrent_config(checked, state_dtype)
    golden_state, ours = args[5].clone(), args[5].clone()
    kept = set(LAUNCH_RECURRENT.compiled)
    launched = []
    for step in range(3):
        golden_out, golden_state = golden_recurrent_step(*args[:5], golden_state, args[6], **kwargs)
        out, compiled = launch_recurrent(*args[:5], ours, args[6], checked, config)
        launched.append(compiled)
        torch.cuda.synchronize()
        assert same_bits(out, golden_out), f"step {step}: out {differ(out, golden_out)}"
        assert same_bits(ours, golden_state), f"step {step}: state {differ(ours, golden_state)}"
    assert launched[0] is launched[1] is launched[2]
    assert len(set(LAUNCH_RECURRENT.compiled) - kept) <= 1


@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "misaligned"])
def test_direct_launches_of_the_conv_kernel_give_the_goldens_bits(shift):
    args, bias = conv_inputs(64, 8192, torch.bfloat16, True, True, seed=21 + shift)
    args = (offset(args[0], shift), *args[1:])
    options = {"bias": bias, "activation": "silu", "dim_first": True}
    checked = check_conv_args(*args, **options, interpreted=False)
    golden_state, ours = args[1].clone(), args[1].clone()
    launched = []
    for step in range(3):
        golden_out, golden_state = golden_conv_update(
            args[0], golden_state, args[2], args[3], **options
        )
        out, compiled = launch_conv(
            args[0], ours, args[2], args[3], bias, checked, conv_config(checked)
        )
        launched.append(compiled)
        torch.cuda.synchronize()
        assert same_bits(out, golden_out), f"step {step}: out {differ(out, golden_out)}"
        assert same_bits(ours, golden_state), f"step {step}: state {differ(ours, golden_state)}"
    assert launched[0] is launched[1] is launched[2]
    assert LAUNCH_CONV.direct


def test_repeated_public_calls_launch_their_plan_with_the_goldens_bits():
    """The second and later calls of ``recurrent_step`` / ``conv_update`` with one call key run
    the kept plan (``kernels.call_plans``); a misaligned input is another key, checked and
    planned on its own; every step's bits are the goldens'."""
    CALL_PLANS.clear()
    for shift in (0, 1, 0):
        args, kwargs = recurrent_inputs(64, 16, 32, 128, 128, torch.bfloat16, seed=31 + shift)
        args = (offset(args[0], shift), *args[1:])
        conv_args, bias = conv_inputs(64, 8192, torch.bfloat16, True, True, seed=41 + shift)
        conv_args = (offset(conv_args[0], shift), *conv_args[1:])
        golden_state, ours = args[5].clone(), args[5].clone()
        golden_conv, ours_conv = conv_args[1].clone(), conv_args[1].clone()
        for step in range(3):
            golden_out, golden_state = golden_recurrent_step(
                *args[:5], golden_state, args[6], **kwargs
            )
            out = recurrent_step(*args[:5], ours, args[6], **kwargs)
            golden_conv_out, golden_conv = golden_conv_update(
                conv_args[0], golden_conv, conv_args[2], conv_args[3], bias=bias
            )
            conv_out = conv_update(conv_args[0], ours_conv, conv_args[2], conv_args[3], bias=bias)
            torch.cuda.synchronize()
            assert same_bits(out, golden_out), f"shift {shift} step {step}: out"
            assert same_bits(ours, golden_state), f"shift {shift} step {step}: state"
            assert same_bits(conv_out, golden_conv_out), f"shift {shift} step {step}: conv out"
            assert same_bits(ours_conv, golden_conv), f"shift {shift} step {step}: conv state"
    assert len(CALL_PLANS.plans) == 4  # (recurrent, conv) x (aligned, misaligned)
