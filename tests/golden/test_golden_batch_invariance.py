"""L1: a row's output and state block do not depend on the rest of the batch (bitwise).

``assert_rows_batch_invariant`` runs an op on a whole batch, on the same batch in shuffled row
order, and on every row alone, and compares bit patterns. The negative controls run it against
deliberately batch-dependent variants of the goldens and require it to fail.
"""

from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor

from vllm_gdn_invariant.golden import conv as conv_module
from vllm_gdn_invariant.golden import conv_update, fixed_order_sum, recurrent_step
from vllm_gdn_invariant.golden import recurrent as recurrent_module
from vllm_gdn_invariant.golden.conv import accumulate_taps
from vllm_gdn_invariant.shadow.bits import same_bits

from .helpers import build_conv_case, build_recurrent_case

# An op maps (per-row tensors, cache, indices) to (out [B, ...], new cache [num_blocks, ...]).
RowOp = Callable[[Sequence[Tensor], Tensor, Tensor], tuple[Tensor, Tensor]]


def assert_rows_batch_invariant(
    op: RowOp, rows: Sequence[Tensor], cache: Tensor, indices: Tensor, seed: int = 0
) -> None:
    """Every row alone, and the batch shuffled, give the batch's bits for output and block."""
    batch = indices.shape[0]
    out, new_cache = op(rows, cache, indices)

    perm = torch.randperm(batch, generator=torch.Generator().manual_seed(seed))
    out_perm, cache_perm = op([r[perm] for r in rows], cache, indices[perm])
    assert same_bits(out_perm, out[perm]), "shuffling the batch changed some output rows"
    assert same_bits(cache_perm, new_cache), "shuffling the batch changed some state blocks"

    for i in range(batch):
        out_i, cache_i = op([r[i : i + 1] for r in rows], cache, indices[i : i + 1])
        assert same_bits(out_i[0], out[i]), f"row {i}: output differs alone vs in the batch"
        block = int(indices[i])
        if block > 0:
            assert same_bits(cache_i[block], new_cache[block]), (
                f"row {i}: state block {block} differs alone vs in the batch"
            )
        else:
            assert not bool(out[i].any()), f"inactive row {i} has a nonzero output"

    touched = indices[indices > 0].long()
    untouched = torch.ones(cache.shape[0], dtype=torch.bool)
    untouched[touched] = False
    assert same_bits(new_cache[untouched], cache[untouched]), "a block of no active row changed"


def recurrent_op(case) -> RowOp:
    def op(rows, state, indices):
        mixed_qkv, a, b = rows
        return recurrent_step(
            mixed_qkv, a, b, case.A_log, case.dt_bias, state, indices, **case.kwargs
        )

    return op


def conv_op(case) -> RowOp:
    def op(rows, conv_state, indices):
        return conv_update(rows[0], conv_state, case.weight, indices, **case.kwargs)

    return op


BATCH_SIZES = (1, 7, 64, 257)


def inactive_rows(batch: int) -> tuple[int, ...]:
    return () if batch < 7 else (1, 5, batch - 1)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("K,V", [(32, 32), (40, 24)], ids=["K32", "K40"])
@pytest.mark.parametrize("batch", BATCH_SIZES)
def test_recurrent_row_bits_do_not_depend_on_batch(batch, K, V, state_dtype):
    # With an fp32 state the inputs and output are fp32 too, so every fp32 bit is compared.
    case = build_recurrent_case(
        batch,
        K=K,
        V=V,
        state_dtype=state_dtype,
        mixed_dtype=state_dtype,
        seed=batch,
        inactive=inactive_rows(batch),
    )
    assert_rows_batch_invariant(
        recurrent_op(case), [case.mixed_qkv, case.a, case.b], case.state, case.state_indices
    )


def test_recurrent_row_bits_do_not_depend_on_batch_without_qk_norm():
    case = build_recurrent_case(64, seed=3, inactive=(2,), use_qk_l2norm=False)
    assert_rows_batch_invariant(
        recurrent_op(case), [case.mixed_qkv, case.a, case.b], case.state, case.state_indices
    )


def test_recurrent_rows_batch_invariant_at_qwen3_next_dims():
    case = build_recurrent_case(64, H=16, HV=32, K=128, V=128, seed=5, inactive=(0,))
    op = recurrent_op(case)
    out, state = op([case.mixed_qkv, case.a, case.b], case.state, case.state_indices)
    for i in (0, 1, 31, 63):
        rows = [case.mixed_qkv[i : i + 1], case.a[i : i + 1], case.b[i : i + 1]]
        out_i, state_i = op(rows, case.state, case.state_indices[i : i + 1])
        assert same_bits(out_i[0], out[i])
        block = int(case.state_indices[i])
        if block > 0:
            assert same_bits(state_i[block], state[block])


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "noact"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_conv_row_bits_do_not_depend_on_batch(cache_dtype, with_bias, activation, dim_first):
    for batch in BATCH_SIZES:
        case = build_conv_case(
            batch,
            cache_dtype=cache_dtype,
            x_dtype=cache_dtype,  # an fp32 output shows every bit of the fp32 accumulator
            with_bias=with_bias,
            activation=activation,
            dim_first=dim_first,
            seed=batch,
            inactive=inactive_rows(batch),
        )
        assert_rows_batch_invariant(conv_op(case), [case.x], case.conv_state, case.state_indices)


def tile_from_batch_sum(x: Tensor) -> Tensor:
    """A batch-dependent reduction: the tile width follows the number of rows (dim 0).

    This is the hazard of kernels that pick a tile from the batch shape: one row alone is
    summed in one piece, a batch in 8-wide tiles added left to right.
    """
    if x.shape[0] == 1:
        return x.sum(-1)
    acc = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], 8):
        acc = acc + x[..., start : start + 8].sum(-1)
    return acc


def bias_last_when_batched(window: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """A batch-dependent tap accumulation: bias added first for one row, last for a batch."""
    if window.shape[0] == 1 or bias is None:
        return accumulate_taps(window, weight, bias)
    return accumulate_taps(window, weight, None) + bias.to(torch.float32)


def test_negative_control_batch_dependent_reduction_fails_the_check(monkeypatch):
    case = build_recurrent_case(64, seed=11, inactive=(3,))
    rows = [case.mixed_qkv, case.a, case.b]
    # The check passes for the golden and the variant differs from it: the patch takes effect.
    assert_rows_batch_invariant(recurrent_op(case), rows, case.state, case.state_indices)
    golden_out, _ = recurrent_op(case)(rows, case.state, case.state_indices)
    with monkeypatch.context() as patch:
        patch.setattr(recurrent_module, "fixed_order_sum", tile_from_batch_sum)
        variant_out, _ = recurrent_op(case)(rows, case.state, case.state_indices)
        assert not same_bits(variant_out, golden_out)
        with pytest.raises(AssertionError, match="differs alone vs in the batch"):
            assert_rows_batch_invariant(recurrent_op(case), rows, case.state, case.state_indices)
    assert recurrent_module.fixed_order_sum is fixed_order_sum


def test_negative_control_batch_dependent_bias_order_fails_the_check(monkeypatch):
    # fp32 output: a one-ULP change of the fp32 accumulator must be visible.
    case = build_conv_case(
        64,
        cache_dtype=torch.float32,
        x_dtype=torch.float32,
        with_bias=True,
        seed=12,
        inactive=(3,),
    )
    assert_rows_batch_invariant(conv_op(case), [case.x], case.conv_state, case.state_indices)
    with monkeypatch.context() as patch:
        patch.setattr(conv_module, "accumulate_taps", bias_last_when_batched)
        with pytest.raises(AssertionError, match="differs alone vs in the batch"):
            assert_rows_batch_invariant(
                conv_op(case), [case.x], case.conv_state, case.state_indices
            )
    assert conv_module.accumulate_taps is accumulate_taps


def test_recurrent_non_contiguous_inputs_give_the_bits_of_contiguous_copies():
    case = build_recurrent_case(9, seed=13, inactive=(4,))
    wide = torch.zeros(9, case.mixed_qkv.shape[1] + 7, dtype=case.mixed_qkv.dtype)
    wide[:, 3 : 3 + case.mixed_qkv.shape[1]] = case.mixed_qkv
    strided_state = case.state.permute(3, 1, 2, 0).contiguous().permute(3, 1, 2, 0)
    out, state = recurrent_step(*case.args(), **case.kwargs)
    out_nc, state_nc = recurrent_step(
        wide[:, 3 : 3 + case.mixed_qkv.shape[1]],
        case.a.t().contiguous().t(),
        case.b,
        case.A_log,
        case.dt_bias,
        strided_state,
        case.state_indices[None].expand(2, -1)[1],
        **case.kwargs,
    )
    assert not strided_state.is_contiguous()
    assert same_bits(out_nc, out)
    assert same_bits(state_nc, state)


def test_conv_non_contiguous_inputs_give_the_bits_of_contiguous_copies():
    case = build_conv_case(9, with_bias=True, seed=14, inactive=(4,))
    strided_state = case.conv_state.transpose(0, 2).contiguous().transpose(0, 2)
    out, state = conv_update(*case.args(), **case.kwargs)
    out_nc, state_nc = conv_update(
        case.x.t().contiguous().t(),
        strided_state,
        case.weight.t().contiguous().t(),
        case.state_indices,
        **case.kwargs,
    )
    assert not strided_state.is_contiguous()
    assert same_bits(out_nc, out)
    assert same_bits(state_nc, state)
