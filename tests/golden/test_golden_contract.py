"""The cache-state contract of recurrent_step and conv_update (contract.py)."""

import math

import pytest
import torch

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.golden import conv as conv_module
from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.golden import recurrent as recurrent_module
from vllm_gdn_invariant.shadow.bits import same_bits

from .helpers import build_conv_case, build_recurrent_case

META = torch.device("meta")


class Computed(Exception):
    """Raised by a patched arithmetic entry point: the op got past validation."""


def refuse_to_compute(*args, **kwargs):
    raise Computed


@pytest.fixture
def no_arithmetic(monkeypatch):
    """Make both ops raise Computed as soon as they reach their arithmetic."""
    monkeypatch.setattr(recurrent_module, "gated_delta_step", refuse_to_compute)
    monkeypatch.setattr(conv_module, "accumulate_taps", refuse_to_compute)


def recurrent_with(case, **changes):
    args = dict(
        zip(
            ["mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "state_indices"],
            case.args(),
            strict=True,
        )
    )
    kwargs = dict(case.kwargs)
    for name, value in changes.items():
        (args if name in args else kwargs)[name] = value
    return recurrent_step(*args.values(), **kwargs)


def conv_with(case, **changes):
    args = dict(zip(["x", "conv_state", "weight", "state_indices"], case.args(), strict=True))
    kwargs = dict(case.kwargs)
    for name, value in changes.items():
        (args if name in args else kwargs)[name] = value
    return conv_update(*args.values(), **kwargs)


# Inactive rows and out-of-place results


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_recurrent_inactive_rows_are_zero_and_leave_state_untouched(state_dtype):
    case = build_recurrent_case(6, state_dtype=state_dtype, seed=1)
    case.state_indices = torch.tensor([0, 3, -1, 0, 5, -7], dtype=torch.int32)  # repeats allowed
    out, new_state = recurrent_step(*case.args(), **case.kwargs)
    assert not bool(out[[0, 2, 3, 5]].any())
    assert bool(out[[1, 4]].any())
    changed = (new_state != case.state).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() == [3, 5]


@pytest.mark.parametrize("dim_first", [True, False])
def test_conv_inactive_rows_are_zero_and_leave_state_untouched(dim_first):
    case = build_conv_case(6, dim_first=dim_first, seed=2)
    case.state_indices = torch.tensor([-2, 4, 0, 0, 1, -2], dtype=torch.int64)
    out, new_state = conv_update(*case.args(), **case.kwargs)
    assert not bool(out[[0, 2, 3, 5]].any())
    assert bool(out[[1, 4]].any())
    changed = (new_state != case.conv_state).flatten(1).any(1)
    assert changed.nonzero().flatten().tolist() == [1, 4]


def test_all_rows_inactive_and_empty_batch_return_zeros_and_an_equal_state():
    case = build_recurrent_case(3, seed=3)
    case.state_indices = torch.zeros(3, dtype=torch.int32)
    out, new_state = recurrent_step(*case.args(), **case.kwargs)
    assert not bool(out.any()) and same_bits(new_state, case.state)
    empty = build_recurrent_case(0, seed=3)
    out, new_state = recurrent_step(*empty.args(), **empty.kwargs)
    assert out.shape == (0, 1, 4, 32) and same_bits(new_state, empty.state)
    conv = build_conv_case(0, seed=3)
    out, new_state = conv_update(*conv.args(), **conv.kwargs)
    assert out.shape == (0, 64) and same_bits(new_state, conv.conv_state)


def test_recurrent_leaves_every_input_unchanged_and_returns_a_new_state():
    case = build_recurrent_case(7, seed=4, inactive=(2,))
    before = [t.clone() for t in case.args()]
    out, new_state = recurrent_step(*case.args(), **case.kwargs)
    for original, now in zip(before, case.args(), strict=True):
        assert same_bits(original, now)
    assert new_state.data_ptr() != case.state.data_ptr()
    assert not same_bits(new_state, case.state)


def test_conv_leaves_every_input_unchanged_and_returns_a_new_state():
    case = build_conv_case(7, with_bias=True, seed=5, inactive=(2,))
    before = [t.clone() for t in case.args()] + [case.kwargs["bias"].clone()]
    out, new_state = conv_update(*case.args(), **case.kwargs)
    for original, now in zip(before, [*case.args(), case.kwargs["bias"]], strict=True):
        assert same_bits(original, now)
    assert new_state.data_ptr() != case.conv_state.data_ptr()
    assert not same_bits(new_state, case.conv_state)


# Index validation, before anything is computed


def test_patched_arithmetic_is_reached_by_a_valid_call(no_arithmetic):
    """The no_arithmetic fixture works, so 'nothing computed' below is a real check."""
    with pytest.raises(Computed):
        recurrent_with(build_recurrent_case(4, seed=6))
    with pytest.raises(Computed):
        conv_with(build_conv_case(4, seed=6))


@pytest.mark.parametrize(
    "indices, message",
    [
        ([1, 2, 11], "out of range"),  # num_blocks = 4 + 5 + 1 = 10
        ([1, 10, 3], "out of range"),
        ([4, 0, 4], "repeats active indices \\[4\\]"),
        ([2, 2, 0], "repeats"),
    ],
)
def test_bad_active_indices_raise_before_anything_is_computed(no_arithmetic, indices, message):
    rec = build_recurrent_case(3, seed=7, extra_blocks=6)
    conv = build_conv_case(3, seed=7, extra_blocks=6)
    bad = torch.tensor(indices, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"state_indices.*{message}"):
        recurrent_with(rec, state_indices=bad)
    with pytest.raises(ValueError, match=f"state_indices.*{message}"):
        conv_with(conv, state_indices=bad)


def contract_error(indices: list[int], num_blocks: int) -> str | None:
    """The contract read in plain Python: the golden's message for the first broken rule."""
    active = [i for i in indices if i > 0]
    out_of_range = [i for i in active if i >= num_blocks]
    if out_of_range:
        return (
            f"state_indices has active indices {out_of_range} out of range for "
            f"num_blocks={num_blocks}"
        )
    repeated = sorted({i for i in active if active.count(i) > 1})
    if repeated:
        return f"state_indices repeats active indices {repeated}; each block has one writer"
    return None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_index_value_check_agrees_with_the_contract_read_in_python(dtype):
    """check_state_index_values reads one verdict for all rows; over random index vectors
    (inactive 0 and negatives repeating, active repeats, out of range, both, empty) it raises
    exactly when and what the contract says."""
    g = torch.Generator().manual_seed(11)
    verdicts = {"pass": 0, "fail": 0}
    for trial in range(400):
        batch = int(torch.randint(0, 9, (), generator=g))
        num_blocks = int(torch.randint(1, 12, (), generator=g))
        indices = torch.randint(-3, num_blocks + 2, (batch,), generator=g).tolist()
        expected = contract_error(indices, num_blocks)
        verdicts["pass" if expected is None else "fail"] += 1
        tensor = torch.tensor(indices, dtype=dtype)
        if expected is None:
            golden.check_state_index_values(tensor, num_blocks=num_blocks)
        else:
            with pytest.raises(ValueError) as info:
                golden.check_state_index_values(tensor, num_blocks=num_blocks)
            assert str(info.value) == expected, (trial, indices, num_blocks)
    assert min(verdicts.values()) > 50  # both outcomes exercised


def test_index_value_check_sees_a_repeat_among_inactive_rows_of_equal_key():
    """Inactive rows (0, -1) between two equal active indices, and equal inactive indices
    beside active ones: only the active repeat is one."""
    golden.check_state_index_values(torch.tensor([0, 0, -1, -1, 3]), num_blocks=5)
    with pytest.raises(ValueError, match=r"repeats active indices \[3\]"):
        golden.check_state_index_values(torch.tensor([3, 0, -1, 0, 3]), num_blocks=5)


@pytest.mark.parametrize(
    "bad, error",
    [
        (torch.tensor([1, 2, 3], dtype=torch.int16), TypeError),
        (torch.tensor([1.0, 2.0, 3.0]), TypeError),
        (torch.tensor([True, False, True]), TypeError),
        (torch.tensor([[1, 2, 3]], dtype=torch.int32), ValueError),
        (torch.tensor([1, 2], dtype=torch.int32), ValueError),
        (torch.tensor([1, 2, 3, 4], dtype=torch.int64), ValueError),
        (torch.tensor([1, 2, 3], dtype=torch.int32, device=META), ValueError),
        ([1, 2, 3], TypeError),
    ],
    ids=["int16", "float", "bool", "2d", "short", "long", "device", "list"],
)
def test_malformed_index_tensor_is_rejected_by_name(no_arithmetic, bad, error):
    with pytest.raises(error, match="state_indices"):
        recurrent_with(build_recurrent_case(3, seed=8), state_indices=bad)
    with pytest.raises(error, match="state_indices"):
        conv_with(build_conv_case(3, seed=8), state_indices=bad)


# Argument validation: shapes, dtypes, devices, head counts


def recurrent_bad_arguments():
    c = build_recurrent_case(3, seed=9)  # H=2, HV=4, K=V=32
    return [
        ("mixed_qkv", c.mixed_qkv[:, :-1], ValueError),
        ("mixed_qkv", c.mixed_qkv[:, :-32], ValueError),  # width consistent with another K
        ("mixed_qkv", c.mixed_qkv[None], ValueError),
        ("mixed_qkv", c.mixed_qkv.to(torch.int32), TypeError),
        ("a", c.a[:, :3], ValueError),
        ("a", c.a[:2], ValueError),
        ("a", c.a.to(torch.int64), TypeError),
        ("a", c.a.to(META), ValueError),
        ("b", c.b[:, :3], ValueError),
        ("b", c.b[0], ValueError),
        ("b", c.b.to(torch.float64), TypeError),
        ("b", c.b.to(META), ValueError),
        ("A_log", c.A_log[:3], ValueError),
        ("A_log", c.A_log.to(torch.int32), TypeError),
        ("A_log", c.A_log.to(META), ValueError),
        ("dt_bias", c.dt_bias[None], ValueError),
        ("dt_bias", c.dt_bias.to(torch.float64), TypeError),
        ("dt_bias", c.dt_bias.to(META), ValueError),
        ("state", c.state[:, :3], ValueError),
        ("state", c.state[..., :16], ValueError),
        ("state", c.state[0], ValueError),
        ("state", c.state.to(torch.float16), TypeError),
        ("state", c.state.to(META), ValueError),
        ("state", c.state.numpy(), TypeError),
    ]


@pytest.mark.parametrize(
    "name, value, error",
    recurrent_bad_arguments(),
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(recurrent_bad_arguments())],
)
def test_recurrent_rejects_a_bad_argument_by_name(no_arithmetic, name, value, error):
    with pytest.raises(error, match=name):
        recurrent_with(build_recurrent_case(3, seed=9), **{name: value})


def test_recurrent_mixed_qkv_on_another_device_is_named():
    case = build_recurrent_case(3, seed=9)
    with pytest.raises(ValueError, match="but mixed_qkv is on meta"):
        recurrent_with(case, mixed_qkv=case.mixed_qkv.to(META))


@pytest.mark.parametrize(
    "num_k_heads, error, message",
    [
        (3, ValueError, "HV % H"),  # HV = 4
        (8, ValueError, "HV % H"),
        (0, ValueError, "num_k_heads must be > 0"),
        (-2, ValueError, "num_k_heads must be > 0"),
        (True, TypeError, "num_k_heads must be an int"),
        (2.0, TypeError, "num_k_heads must be an int"),
        ("2", TypeError, "num_k_heads must be an int"),
        (1, ValueError, "state.shape\\[3\\]"),  # divides HV but gives K = 64
    ],
)
def test_recurrent_rejects_bad_head_counts(no_arithmetic, num_k_heads, error, message):
    with pytest.raises(error, match=message):
        recurrent_with(build_recurrent_case(3, seed=10), num_k_heads=num_k_heads)


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("scale", True, TypeError),
        ("scale", "0.1", TypeError),
        ("scale", float("nan"), ValueError),
        ("use_qk_l2norm", 1, TypeError),
        ("use_qk_l2norm", None, TypeError),
    ],
)
def test_recurrent_rejects_bad_options_by_name(no_arithmetic, name, value, error):
    with pytest.raises(error, match=name):
        recurrent_with(build_recurrent_case(3, seed=11), **{name: value})


def conv_bad_arguments():
    c = build_conv_case(3, seed=12, with_bias=True)  # dim=64, W=4, dim_first
    return [
        ("x", c.x[None], ValueError),
        ("x", c.x.to(torch.int32), TypeError),
        ("x", c.x.to(torch.float64), TypeError),
        ("weight", c.weight[:32], ValueError),
        ("weight", c.weight[:, :1], ValueError),
        ("weight", c.weight[:, :3], ValueError),  # W-1 no longer matches conv_state
        ("weight", c.weight.to(META), ValueError),
        ("weight", c.weight[None], ValueError),
        ("conv_state", c.conv_state.transpose(1, 2), ValueError),  # the other layout
        ("conv_state", c.conv_state[:, :, :2], ValueError),
        ("conv_state", c.conv_state[0], ValueError),
        ("conv_state", c.conv_state.to(torch.float64), TypeError),
        ("conv_state", c.conv_state.to(META), ValueError),
        ("bias", c.kwargs["bias"][:10], ValueError),
        ("bias", c.kwargs["bias"][None], ValueError),
        ("bias", c.kwargs["bias"].to(torch.int32), TypeError),
        ("bias", c.kwargs["bias"].to(META), ValueError),
        ("activation", "relu", ValueError),
        ("activation", True, TypeError),
        ("dim_first", 1, TypeError),
    ]


@pytest.mark.parametrize(
    "name, value, error",
    conv_bad_arguments(),
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(conv_bad_arguments())],
)
def test_conv_rejects_a_bad_argument_by_name(no_arithmetic, name, value, error):
    with pytest.raises(error, match=name):
        conv_with(build_conv_case(3, seed=12, with_bias=True), **{name: value})


def test_conv_x_on_another_device_is_named():
    case = build_conv_case(3, seed=12)
    with pytest.raises(ValueError, match="but x is on meta"):
        conv_with(case, x=case.x.to(META))


def test_conv_state_layout_follows_dim_first():
    case = build_conv_case(3, seed=13, dim_first=False)  # [num_blocks, W-1, dim]
    conv_update(*case.args(), **case.kwargs)
    with pytest.raises(ValueError, match="conv_state"):
        conv_with(case, dim_first=True)


def test_scale_is_rounded_to_fp32_as_torch_rounds_it_and_zero_keeps_its_sign():
    values = [0.0, -0.0, 0.1, -0.1, 128**-0.5, 1e-40, -1e-45, 3.4028235677973366e38, 1e39, -1e300]
    for value in values + list(reversed(values)):  # a cached value must not answer for another
        expected = torch.tensor(value, dtype=torch.float32).item()
        got = golden.fp32_scale(value)
        assert got == expected or (got != got and expected != expected)
        assert math.copysign(1.0, got) == math.copysign(1.0, expected)
