"""The replay kernels give the goldens' bits token by token, interpreted on CPU tensors.

``replay_tokens`` runs on copies of the two caches; its ``out`` and the whole caches (blocks
nobody owns included) are compared on bit views with ``golden.conv_update`` then
``golden.recurrent_step`` applied token by token (replay_cases.golden_replay). The cases: odd K
and V (padded), W = 4, sequences of lengths 0 to 3 (shorter and longer than the W-1 history),
fp32 / bf16 / fp16 conv state, fp32 / bf16 state, bias or not, SiLU or not, both conv layouts,
int32 and int64 indices in shuffled block order, inactive sequences (conv, state or both), grouped
heads, no QK norm, strided x. Then two launch shapes, a strided ``out``, and negative controls:
a kernel summing in another order, and a reference without the per-token state rounding, each
fail the same comparison.
"""

from __future__ import annotations

import pytest
import torch

from vllm_gdn_invariant.shadow.bits import differ, same_bits

from .conftest import import_interpreted_submodule
from .replay_cases import ReplayCase, build_replay_case, golden_replay

CASES = {
    "fp32state-bf16conv-bias-silu-dimfirst": (
        [3, 0, 1, 2],
        dict(state_dtype=torch.float32, conv_dtype=torch.bfloat16, with_bias=True),
    ),
    "bf16state-fp32conv-nobias-linear-tokenfirst-int64": (
        [2, 1, 0, 3],
        dict(
            state_dtype=torch.bfloat16,
            conv_dtype=torch.float32,
            with_bias=False,
            activation=None,
            dim_first=False,
            index_dtype=torch.int64,
        ),
    ),
    # sequence 1: conv inactive; 2: both inactive; 3: state inactive
    "bf16state-bf16conv-inactive-tokenfirst": (
        [2, 2, 1, 1],
        dict(
            state_dtype=torch.bfloat16,
            dim_first=False,
            conv_inactive={1: 0, 2: -1},
            state_inactive={2: 0, 3: -2},
        ),
    ),
    "fp32x-fp16conv-noqknorm-grouped-heads": (
        [1, 2],
        dict(
            H=2,
            HV=4,
            K=3,
            V=5,
            x_dtype=torch.float32,
            conv_dtype=torch.float16,
            weight_dtype=torch.float32,
            use_qk_l2norm=False,
        ),
    ),
}


@pytest.fixture(scope="module")
def replay(kernels):
    return import_interpreted_submodule("replay")


def build(name: str) -> ReplayCase:
    lengths, options = CASES[name]
    return build_replay_case(lengths, seed=len(name), **options)


def run_kernel(replay, case: ReplayCase, config=None):
    """(out, conv_state, state) of the kernel on copies of the caches (default or given shape)."""
    got = case.with_states_copied()
    if config is None:
        out = replay.replay_tokens(*got.tensors(), **got.options)
    else:
        tensors = replay.ReplayTensors(*got.tensors())
        dims = replay.replay_dims(tensors, **got.options)
        out = torch.empty((got.x.shape[0], *got.state.shape[1:3]), dtype=got.x.dtype)
        replay.launch_replay(tensors, out, dims, config)
    return out, got.conv_state, got.state


def mismatches(got, want) -> dict[str, int]:
    """Differing elements of out, the whole conv cache and the whole state cache."""
    names = ("out", "conv_state", "state")
    return {
        name: differ(g, w) if g.shape == w.shape else -1
        for name, g, w in zip(names, got, want, strict=True)
        if not same_bits(g, w)
    }


@pytest.fixture(scope="module")
def results(replay):
    """Kernel and golden results per case, computed once for the tests that share them."""
    cache = {}

    def get(name: str):
        if name not in cache:
            case = build(name)
            cache[name] = (case, run_kernel(replay, case), golden_replay(case))
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_replay_gives_the_goldens_bits_token_by_token(results, name):
    case, got, want = results(name)
    assert mismatches(got, want) == {}
    assert bool(got[0].ne(0).any()), "a vacuous case: every output is zero"


def test_blocks_of_inactive_sequences_and_of_nobody_are_untouched(results):
    case, (out, conv_state, state), _ = results("bf16state-bf16conv-inactive-tokenfirst")
    conv_owners = {int(i) for i in case.conv_indices if i > 0}
    state_owners = {int(i) for i in case.state_indices if i > 0}
    for block in range(case.state.shape[0]):
        if block not in conv_owners:
            assert same_bits(conv_state[block], case.conv_state[block]), f"conv block {block}"
        if block not in state_owners:
            assert same_bits(state[block], case.state[block]), f"state block {block}"
    starts = case.cu_seqlens.tolist()
    for s in (2, 3):  # state inactive: zero outputs
        assert not bool(out[starts[s] : starts[s + 1]].ne(0).any())
    decayed = int(case.state_indices[1])  # conv inactive: the state still runs (on zeros)
    assert not same_bits(state[decayed], case.state[decayed])


def test_two_launch_shapes_give_the_same_bits(replay):
    """All value rows and the K split into 2 slabs of 4 (the interpreter's default), against
    blocks of 2 of the 3 value rows (a partial block) and K as 8 lanes of 1 element."""
    case = build_replay_case([2, 1], H=1, HV=1, K=5, V=3, state_dtype=torch.bfloat16, seed=3)
    want = golden_replay(case)
    wide = replay.ReplayConfig(block_v=4, log2_j=1, log2_cl=0, log2_vec=2, num_warps=1)
    narrow = replay.ReplayConfig(block_v=2, log2_j=0, log2_cl=3, log2_vec=0, num_warps=1)
    for config in (wide, narrow):
        assert mismatches(run_kernel(replay, case, config), want) == {}, config


def test_default_launch_shape_on_an_h200_for_qwen3_next(replay):
    """4 value rows of 32 K-elements per thread over 4 warps (a value head per program at
    K = V = 128), 2 while (sequence, value head) pairs are fewer than the 132 SMs."""

    def config(sequences, H, HV, state_dtype):
        dims = replay.ReplayDims(sequences, H, HV, 128, 128, 4, 128**-0.5)
        return replay.replay_config(dims, state_dtype, 132, interpreted=False)

    for sequences, H, HV in ((64, 16, 32), (8, 16, 32), (64, 4, 8), (17, 4, 8)):
        assert config(sequences, H, HV, torch.float32) == replay.ReplayConfig(128, 3, 2, 2, 4)
        assert config(sequences, H, HV, torch.bfloat16) == replay.ReplayConfig(128, 2, 2, 3, 4)
    for sequences in (16, 8, 1):  # 128 pairs or fewer
        assert config(sequences, 4, 8, torch.float32) == replay.ReplayConfig(64, 3, 2, 2, 4)
        assert config(sequences, 4, 8, torch.bfloat16) == replay.ReplayConfig(64, 2, 2, 3, 4)


def test_out_given_as_a_strided_view_is_written_in_place(replay):
    case = build_replay_case([2], H=1, HV=1, K=5, V=3, seed=4)
    want_out, _, _ = golden_replay(case)
    buffer = torch.full((2, 1, 5), float("nan"), dtype=case.x.dtype)
    got = case.with_states_copied()
    out = replay.replay_tokens(*got.tensors(), **got.options, out=buffer[..., 1:4])
    assert out.data_ptr() == buffer[..., 1:4].data_ptr()
    assert same_bits(buffer[..., 1:4], want_out)
    assert bool(buffer[..., 0].isnan().all() and buffer[..., 4].isnan().all())


def test_no_tokens_leaves_the_caches_untouched(replay):
    case = build_replay_case([0, 0], seed=5)
    out, conv_state, state = run_kernel(replay, case)
    assert out.shape == (0, 2, 3)
    assert same_bits(conv_state, case.conv_state) and same_bits(state, case.state)


# Negative controls: the same comparison fails on a wrong implementation.


def test_a_replay_summing_in_another_order_fails(replay, kernels, probes, monkeypatch):
    case = build_replay_case([3], HV=1, K=7, x_dtype=torch.float32, seed=6)
    want = golden_replay(case)
    assert mismatches(run_kernel(replay, case), want) == {}
    monkeypatch.setattr(kernels.recurrent, "fixed_order_sum_slabs", probes.sequential_sum)
    assert mismatches(run_kernel(replay, case), want) != {}


def test_a_reference_without_the_per_token_state_rounding_fails(results):
    """The goldens run on an fp32 copy of a bf16 state (rounded once, at the end) disagree with
    the kernel, which rounds after every token as the decode step's store does."""
    case, got, want = results("bf16state-fp32conv-nobias-linear-tokenfirst-int64")
    unrounded = case.with_states_copied()
    unrounded.state = case.state.to(torch.float32)
    out, conv_state, state = golden_replay(unrounded)
    assert same_bits(conv_state, want[1])  # the conv does not depend on the state
    assert mismatches(got, (out, conv_state, state.to(torch.bfloat16))).keys() >= {"out", "state"}
