"""The recurrent kernel gives the golden's bits, interpreted on CPU tensors.

``out`` and the state, updated in place, are compared on bit views with ``golden.recurrent_step``
on the same inputs: odd batch sizes, K and V (padded K, partial value-row blocks), grouped heads,
fp32 and bf16 states, bf16 / fp16 / fp32 inputs, with and without the QK norm, inactive rows
(0 and negative) mixed in, strided inputs, values at the gates' thresholds, and every launch
shape the tile can take.
"""

import dataclasses

import pytest
import torch

from gdn_evidence.harness.launch_shapes import recurrent_candidates
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.kernels.validation import RecurrentDims
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_recurrent_case

# (B, H, HV, K, V, state dtype, mixed_qkv dtype, QK norm, inactive rows)
CASES = [
    (3, 2, 4, 5, 7, torch.float32, torch.bfloat16, True, (1,)),
    (5, 1, 3, 33, 17, torch.bfloat16, torch.float16, False, (0, 3)),
    (1, 2, 2, 16, 16, torch.float32, torch.float32, True, ()),
    (2, 1, 2, 64, 9, torch.bfloat16, torch.bfloat16, True, (1,)),
    (7, 2, 4, 8, 3, torch.bfloat16, torch.float32, True, (0, 2, 6)),
    (3, 1, 1, 1, 1, torch.float32, torch.bfloat16, False, (2,)),
    (1, 1, 2, 128, 5, torch.float32, torch.bfloat16, True, ()),
    (4, 2, 2, 3, 33, torch.float32, torch.float16, True, (0, 1, 2, 3)),
]


def case_id(case) -> str:
    B, H, HV, K, V, state, mixed, norm, inactive = case
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    shape = f"B{B}-H{H}-HV{HV}-K{K}-V{V}"
    return f"{shape}-{dtype[state]}-{dtype[mixed]}-norm{int(norm)}-off{len(inactive)}"


def assert_matches_golden(kernels, case, launch=None):
    """Run the kernel on a copy of the state and compare out and the whole state with the
    golden's out and new_state, on bit views."""
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)
    state = case.state.clone()
    args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state, case.state_indices)
    if launch is None:
        out = kernels.recurrent_step(*args, **case.kwargs)
    else:
        out = launch(*args)
    assert same_bits(out, golden_out), "out differs from the golden's"
    assert same_bits(state, golden_state), "the updated state differs from the golden's"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_recurrent_step_gives_the_goldens_bits(kernels, case):
    B, H, HV, K, V, state_dtype, mixed_dtype, norm, inactive = case
    built = build_recurrent_case(
        B,
        H=H,
        HV=HV,
        K=K,
        V=V,
        state_dtype=state_dtype,
        mixed_dtype=mixed_dtype,
        inactive=inactive,
        use_qk_l2norm=norm,
        seed=B * 1000 + K,
    )
    assert_matches_golden(kernels, built)


def tile_configs(kernels, K: int, V: int) -> list:
    """Launch shapes: every split of the padded K into slabs, lanes and vectors, with blocks of
    1, 2 and all value rows."""
    width = (1 << (K - 1).bit_length()).bit_length() - 1
    block_v = 1 << (V - 1).bit_length()
    configs = []
    for log2_j in range(width + 1):
        for log2_cl in range(width - log2_j + 1):
            for rows in sorted({1, 2, block_v}):
                configs.append(
                    kernels.recurrent.RecurrentConfig(
                        rows, log2_j, log2_cl, width - log2_j - log2_cl, num_warps=1
                    )
                )
    return configs


def test_launch_shape_changes_no_bits(kernels):
    case = build_recurrent_case(2, H=1, HV=2, K=6, V=3, inactive=(1,), seed=7)
    for config in tile_configs(kernels, K=6, V=3):

        def launch(*args, config=config):
            dims = kernels.validation.check_recurrent_args(*args, **case.kwargs, interpreted=True)
            out, _ = kernels.recurrent.launch_recurrent(*args, dims, config)
            return out

        assert_matches_golden(kernels, case, launch)


@pytest.mark.parametrize(
    "V, block_v, chunks", [(3, 1, 2), (3, 2, 2), (3, 1, 3), (17, 4, 3), (17, 2, 8), (17, 8, 2)]
)
def test_blocks_of_value_rows_taken_one_after_another_change_no_bits(kernels, V, block_v, chunks):
    """A program that takes ``chunks`` blocks of value rows in turn (the next block's loads
    before this block's arithmetic), partial blocks and blocks wholly past V among them, and
    the zero output of inactive rows over every block."""
    case = build_recurrent_case(3, H=1, HV=2, K=6, V=V, inactive=(1,), seed=V * 10 + chunks)
    config = kernels.recurrent.RecurrentConfig(block_v, 1, 1, 1, num_warps=1, chunks=chunks)

    def launch(*args):
        dims = kernels.validation.check_recurrent_args(*args, **case.kwargs, interpreted=True)
        out, _ = kernels.recurrent.launch_recurrent(*args, dims, config)
        return out

    assert_matches_golden(kernels, case, launch)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_launch_shape_the_sweep_times_gives_the_goldens_bits(kernels, state_dtype):
    """The sweep's candidates (gdn_evidence/harness/launch_shapes.py) for K = 128 and V = 64,
    blocks of 4 to 64 value rows, up to 16 per program, and the GPU defaults of every shape
    rule there; an active row and an inactive one."""
    dims = RecurrentDims(2, 1, 1, 128, 64, 128**-0.5, True)
    case = build_recurrent_case(
        2, H=1, HV=1, K=128, V=64, state_dtype=state_dtype, inactive=(1,), seed=5
    )
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)
    candidates = recurrent_candidates(dims, state_dtype)
    assert any(c.chunks > 1 for c in candidates)
    rules = kernels.recurrent.SHAPE_RULES[state_dtype]
    defaults = {
        kernels.recurrent.recurrent_config(
            dataclasses.replace(dims, batch=max(1, pairs)), state_dtype, interpreted=False
        )
        for pairs, _ in rules
    }
    assert len(defaults) == len(rules)
    for config in [*defaults, *candidates]:
        state = case.state.clone()
        args = (case.mixed_qkv, case.a, case.b, case.A_log, case.dt_bias, state)
        checked = kernels.validation.check_recurrent_args(
            *args, case.state_indices, **case.kwargs, interpreted=True
        )
        interpreted = kernels.recurrent.RecurrentConfig(**config.__dict__)
        out, _ = kernels.recurrent.launch_recurrent(*args, case.state_indices, checked, interpreted)
        assert same_bits(out, golden_out), config
        assert same_bits(state, golden_state), config


def test_default_launch_shapes_on_a_gpu_follow_the_shape_rules_at_qwen3_next(kernels):
    """The GPU's launch shape for Qwen3-Next's heads (32 value heads) by batch size: fp32
    programs of one warp over 8 value rows, 32 elements of K per thread below 512 (row, head)
    pairs, 16 from there and 4 (the whole K as one slab, vLLM's layout) from 8192; bf16 one
    warp over 8 rows, then 64 rows over 2 warps, then blocks of 16 rows over 2 warps taken 4
    and 8 to a program."""
    dims = kernels.validation.RecurrentDims(64, 16, 32, 128, 128, 128**-0.5, True)
    shape = kernels.recurrent.RecurrentConfig

    def config(batch: int, state_dtype: torch.dtype):
        at = dataclasses.replace(dims, batch=batch)
        return kernels.recurrent.recurrent_config(at, state_dtype, interpreted=False)

    for batch in (1, 8):
        assert config(batch, torch.float32) == shape(8, 3, 2, 2, 1, 1)
    for batch in (16, 64, 128):
        assert config(batch, torch.float32) == shape(8, 2, 3, 2, 1, 1)
    for batch in (256, 1024):
        assert config(batch, torch.float32) == shape(8, 0, 5, 2, 1, 1)
    assert config(4, torch.bfloat16) == shape(8, 3, 2, 2, 1, 1)
    assert config(8, torch.bfloat16) == shape(64, 2, 2, 3, 2, 1)
    assert config(16, torch.bfloat16) == shape(16, 3, 2, 2, 2, 4)
    for batch in (32, 1024):
        assert config(batch, torch.bfloat16) == shape(16, 2, 2, 3, 2, 8)


def test_default_launch_shapes_fit_short_heads(kernels):
    """Heads shorter than a rule's block: the block is the padded V, warps and blocks per
    program shrink so that no thread holds a copy of a row and no block is wholly masked."""
    for V, K in ((4, 7), (16, 33), (8, 128)):
        for batch in (1, 8, 16, 64):
            dims = kernels.validation.RecurrentDims(batch, 2, 32, K, V, K**-0.5, True)
            for state_dtype in (torch.float32, torch.bfloat16):
                c = kernels.recurrent.recurrent_config(dims, state_dtype, interpreted=False)
                padded_v = kernels.launch.next_power_of_2(V)
                assert c.block_v * c.chunks <= padded_v, (c, V)
                rows_per_warp = 32 >> c.log2_cl
                assert c.num_warps == 1 or c.block_v >= rows_per_warp * c.num_warps, c
                assert 2 ** (c.log2_j + c.log2_cl + c.log2_vec) == kernels.launch.next_power_of_2(K)


def test_strided_inputs_and_a_state_inside_a_wider_buffer(kernels):
    case = build_recurrent_case(3, H=2, HV=4, K=7, V=5, inactive=(1,), seed=11)
    width = case.mixed_qkv.shape[1]
    case.mixed_qkv = case.mixed_qkv.t().contiguous().t()  # column-major: stride (1, B)
    assert case.mixed_qkv.stride(1) != 1
    case.a = case.a.t().contiguous().t()
    case.b = torch.cat([case.b, case.b], dim=1)[:, : case.b.shape[1]]
    buffer = torch.randn(*case.state.shape[:3], 9, generator=torch.Generator().manual_seed(1))
    buffer[..., :7] = case.state
    case.state = buffer[..., :7]  # stride (.., 9, 1): K = 7 inside a row of 9
    before = buffer.clone()
    golden_out, golden_state = golden_recurrent_step(*case.args(), **case.kwargs)
    out = kernels.recurrent_step(*case.args(), **case.kwargs)
    assert case.mixed_qkv.shape[1] == width
    assert same_bits(out, golden_out)
    assert same_bits(case.state, golden_state)
    assert same_bits(buffer[..., 7:], before[..., 7:]), "wrote outside the state's view"


def test_values_at_the_gate_thresholds_and_signed_zeros(kernels):
    case = build_recurrent_case(6, H=1, HV=4, K=9, V=6, inactive=(5,), seed=5)
    case.a = torch.tensor([19.5, 20.0, 20.5, -30.0]).repeat(6, 1) - case.dt_bias  # softplus edge
    case.b = torch.tensor([-90.0, -1e-30, 0.0, 95.0]).repeat(6, 1)
    case.A_log = torch.tensor([-120.0, 0.0, 4.0, -0.0])  # exp(A_log) from 0 to 55
    H, K = 1, 9
    case.mixed_qkv[0, : 2 * H * K] = 0.0  # zero q and k: norms of sqrt(1e-6)
    case.mixed_qkv[1, : H * K] = -0.0
    case.state[int(case.state_indices[2])] = -0.0
    case.state[int(case.state_indices[3])] *= 1e-40  # subnormal state
    assert_matches_golden(kernels, case)


def test_state_is_updated_in_place_and_only_in_the_active_blocks(kernels):
    case = build_recurrent_case(4, state_dtype=torch.bfloat16, K=5, V=3, inactive=(0, 2), seed=3)
    case.state_indices = torch.tensor([0, 2, -4, 5], dtype=torch.int64)
    state = case.state
    before = state.clone()
    out = kernels.recurrent_step(*case.args(), **case.kwargs)
    assert case.state is state
    changed = (state.view(torch.int16) != before.view(torch.int16)).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() == [2, 5]
    assert not bool(out[[0, 2]].any())
    assert bool(out[[1, 3]].any())


def test_empty_batch_returns_an_empty_out(kernels):
    case = build_recurrent_case(0, K=5, V=3)
    before = case.state.clone()
    out = kernels.recurrent_step(*case.args(), **case.kwargs)
    assert out.shape == (0, 1, 4, 3)
    assert same_bits(case.state, before)
