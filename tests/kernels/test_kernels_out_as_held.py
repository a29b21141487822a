"""The recurrent kernel stores each block's outputs from the layout its K-sum leaves them in
(OUT_AS_HELD, ``recurrent.store_as_held``: inline PTX ``st.global`` by every thread holding an
output) exactly where ``recurrent.out_as_held`` says: an NVIDIA target (ROCm's has no NVIDIA
capability), compiled. Compiled for sm_90 without a GPU, that store takes the two barriers of the
output's trip through shared memory out of the loop over blocks. In the interpreter the store is
``tl.store`` at the same addresses, so the rows and masks of that path (partial blocks, blocks
past V, inactive rows) are checked for the goldens' bits there, and kernels with one of its lines
changed fail; tests/gpu/test_kernels_bitwise.py checks the compiled store on a GPU."""

from types import SimpleNamespace

import pytest
import torch

from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels import recurrent as recurrent_kernel
from vllm_gdn_invariant.kernels.recurrent import device_capability, out_as_held
from vllm_gdn_invariant.kernels.validation import RecurrentDims
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_recurrent_case
from .conftest import import_mutated_recurrent

H, HV, K, V = 16, 32, 128, 128


def test_the_rule_is_on_for_compiled_nvidia_targets_only():
    assert out_as_held(90, interpreted=False)
    assert out_as_held(80, interpreted=False)
    assert out_as_held(100, interpreted=False)
    assert not out_as_held(0, interpreted=False)  # no NVIDIA target: a CPU or ROCm device
    assert not out_as_held(90, interpreted=True)


def test_a_rocm_device_has_no_nvidia_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 4))
    monkeypatch.setattr(torch.version, "hip", None)
    assert device_capability(torch.device("cuda", 0)) == 94  # what an NVIDIA build would say
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert device_capability(torch.device("cuda", 0)) == 0
    assert device_capability(torch.device("cpu")) == 0


def kernel_constexprs(capability: int | None) -> dict:
    batch = 2
    gates = torch.zeros(batch, HV, dtype=torch.bfloat16)
    config = recurrent_kernel.RecurrentConfig(16, 0, 3, 3, num_warps=2, chunks=8)
    _, _, constexprs = recurrent_kernel.kernel_arguments(
        torch.zeros(batch, 2 * H * K + HV * V, dtype=torch.bfloat16),
        gates,
        gates,
        torch.zeros(HV),
        torch.zeros(HV),
        torch.zeros(batch, 1, HV, V, dtype=torch.bfloat16),
        torch.zeros(4, HV, V, K, dtype=torch.bfloat16),
        torch.zeros(batch, dtype=torch.int32),
        RecurrentDims(batch, H, HV, K, V, K**-0.5, True),
        config,
        capability,
    )
    return constexprs


@pytest.mark.skipif(recurrent_kernel.INTERPRETED, reason="the rule is off when interpreted")
def test_the_launch_arguments_carry_the_rule_for_the_target():
    assert kernel_constexprs(90)["OUT_AS_HELD"] is True
    assert kernel_constexprs(0)["OUT_AS_HELD"] is False
    assert kernel_constexprs(None)["OUT_AS_HELD"] is False  # a CPU tensor: no target


needs_nvidia_tools = pytest.mark.skipif(
    not codegen.nvidia_tool("nvdisasm").exists() or recurrent_kernel.INTERPRETED,
    reason="compiles for the GPU without one: Triton's NVIDIA tools, not interpreted",
)


def with_out_as_held(held: bool) -> SimpleNamespace:
    """kernels.recurrent with OUT_AS_HELD set to ``held`` in its launch arguments."""

    def kernel_arguments(*arguments):
        grid, positional, constexprs = recurrent_kernel.kernel_arguments(*arguments)
        return grid, positional, constexprs | {"OUT_AS_HELD": held}

    return SimpleNamespace(
        recurrent_step_kernel=recurrent_kernel.recurrent_step_kernel,
        kernel_arguments=kernel_arguments,
        recurrent_config=recurrent_kernel.recurrent_config,
    )


@needs_nvidia_tools
@pytest.mark.parametrize("batch", [16, 128])  # bf16 programs of 4 and 8 blocks
def test_the_store_as_held_takes_the_outputs_barriers_out_of_the_loop(batch):
    dims = RecurrentDims(batch, H, HV, K, V, K**-0.5, True)
    compiled = {
        held: codegen.compile_recurrent(
            dims, state_dtype=torch.bfloat16, module=with_out_as_held(held)
        )
        for held in (False, True)
    }
    ptx = {held: c.asm["ptx"] for held, c in compiled.items()}
    assert ptx[True].count("bar.sync") == ptx[False].count("bar.sync") - 2
    store_as_held = "@p st.global.b16"  # store_as_held's inline PTX
    assert store_as_held in ptx[True] and store_as_held not in ptx[False]
    usage = {held: codegen.resource_usage(c) for held, c in compiled.items()}
    assert not usage[True].spills and usage[True].registers <= usage[False].registers
    assert codegen.report_of(compiled[True]).clean


def matches_golden_with_out_as_held(module, case, config) -> bool:
    """``module`` (kernels.recurrent, interpreted) run with OUT_AS_HELD on at ``config``: its
    output and state against the golden's, bit for bit, and nothing written past the output (it
    lies at the start of a buffer of sevens)."""
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)
    state = case.state.clone()
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state, case.state_indices)
    dims = module.check_recurrent_args(*args, **case.kwargs, interpreted=True)
    shape = module.new_output(case.mixed_qkv, dims).shape
    buffer = torch.full((shape.numel() + 64,), 7.0, dtype=case.mixed_qkv.dtype)
    out = buffer[: shape.numel()].view(shape)
    grid, arguments, constexprs = module.kernel_arguments(*args[:5], out, *args[5:], dims, config)
    module.recurrent_step_kernel[grid](
        *arguments, **(constexprs | {"OUT_AS_HELD": True}), num_warps=config.num_warps
    )
    past_out = buffer[shape.numel() :]
    return (
        same_bits(out, golden_out)
        and same_bits(state, golden_state)
        and same_bits(past_out, torch.full_like(past_out, 7.0))
    )


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "V, block_v, chunks", [(3, 1, 2), (17, 4, 3), (17, 2, 8), (17, 8, 2), (16, 4, 4), (5, 8, 1)]
)
def test_outputs_stored_as_held_are_the_goldens_bits(kernels, V, block_v, chunks, state_dtype):
    """Blocks in turn, partial blocks and blocks wholly past V, one block per program, an
    inactive row; the output starts as sevens, so a row left unwritten shows."""
    case = build_recurrent_case(
        3, H=1, HV=2, K=6, V=V, state_dtype=state_dtype, inactive=(1,), seed=V + chunks
    )
    config = kernels.recurrent.RecurrentConfig(block_v, 1, 1, 1, num_warps=1, chunks=chunks)
    assert matches_golden_with_out_as_held(kernels.recurrent, case, config)


# Kernels whose store as held is wrong: each replaces one expression of it (it must be there).
MUTATIONS = {
    "block_row_not_advanced": ("first_row + i_c * BV, i_nh", "first_row, i_nh"),
    "rows_past_v_stored": ("rows < V)", "rows < V + BV)"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_kernel_that_stores_as_held_wrongly_fails(kernels, mutation, tmp_path):
    mutated = import_mutated_recurrent(f"recurrent_held_{mutation}", *MUTATIONS[mutation], tmp_path)
    case = build_recurrent_case(3, H=1, HV=2, K=6, V=17, inactive=(1,), seed=3)
    config = kernels.recurrent.RecurrentConfig(4, 1, 1, 1, num_warps=1, chunks=3)
    assert matches_golden_with_out_as_held(kernels.recurrent, case, config)
    assert not matches_golden_with_out_as_held(mutated, case, config)
