"""The kernels' wrappers check their arguments as the goldens do, before anything is written.

Every bad argument below makes the kernel raise the golden's exception type with the golden's
message, and leaves the state's bits as they were. The kernels' validation calls the goldens'
checks (``golden.check_recurrent_dims`` / ``check_conv_dims``, then
``check_state_index_values``); negative controls swap the checks the kernels call for ones that
raise another message or type, and require every comparison to see it. The kernels' own limits
(CPU tensors outside the interpreter, a state whose elements overlap) raise ValueError, after
the goldens' checks and before any write.
"""

import functools

import pytest
import torch

import vllm_gdn_invariant.golden as golden_package
import vllm_gdn_invariant.kernels as compiled_kernels
from vllm_gdn_invariant.golden import conv_update as golden_conv_update
from vllm_gdn_invariant.golden import recurrent_step as golden_recurrent_step
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_conv_case, build_recurrent_case

META = torch.device("meta")

RECURRENT_NAMES = ["mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "state_indices"]
CONV_NAMES = ["x", "conv_state", "weight", "state_indices"]


def with_changes(names, case, changes):
    """(positional args, kwargs) of ``case`` with ``changes`` applied (callables get the old
    value)."""
    args = dict(zip(names, case.args(), strict=True))
    kwargs = dict(case.kwargs)
    for name, value in changes.items():
        target = args if name in args else kwargs
        target[name] = value(target[name]) if callable(value) else value
    return list(args.values()), kwargs


BAD_RECURRENT = {
    "mixed_qkv not a tensor": {"mixed_qkv": lambda t: t.tolist()},
    "mixed_qkv int": {"mixed_qkv": lambda t: t.to(torch.int32)},
    "mixed_qkv 3-D": {"mixed_qkv": lambda t: t[None]},
    "a on another device": {"a": lambda t: t.to(META)},
    "a wrong rows": {"a": lambda t: t[:-1]},
    "b wrong heads": {"b": lambda t: t[:, :-1]},
    "A_log 2-D": {"A_log": lambda t: t[None]},
    "dt_bias wrong length": {"dt_bias": lambda t: t[:-1]},
    "state fp16": {"state": lambda t: t.half()},
    "state 3-D": {"state": lambda t: t[0]},
    "state wrong HV": {"state": lambda t: t[:, :-1]},
    "state wrong K": {"state": lambda t: t[..., :-1]},
    "num_k_heads bool": {"num_k_heads": True},
    "num_k_heads zero": {"num_k_heads": 0},
    "num_k_heads not dividing HV": {"num_k_heads": 3},
    "scale NaN": {"scale": float("nan")},
    "scale a string": {"scale": "0.1"},
    "use_qk_l2norm int": {"use_qk_l2norm": 1},
    "indices float": {"state_indices": lambda t: t.float()},
    "indices wrong length": {"state_indices": lambda t: t[:-1]},
    "indices out of range": {"state_indices": lambda t: torch.full_like(t, 10_000)},
    "indices repeated": {"state_indices": lambda t: torch.full_like(t, 2)},
}

BAD_CONV = {
    "x int": {"x": lambda t: t.to(torch.int64)},
    "x 1-D": {"x": lambda t: t[0]},
    "weight wrong dim": {"weight": lambda t: t[:-1]},
    "weight one tap": {"weight": lambda t: t[:, :1]},
    "conv_state fp64": {"conv_state": lambda t: t.double()},
    "conv_state wrong taps": {"conv_state": lambda t: t[..., :-1]},
    "conv_state other layout": {"dim_first": False},
    "bias wrong length": {"bias": lambda t: torch.zeros(3)},
    "bias on another device": {"bias": lambda t: torch.zeros(64, device=META)},
    "activation relu": {"activation": "relu"},
    "activation bool": {"activation": True},
    "dim_first string": {"dim_first": "yes"},
    "indices 2-D": {"state_indices": lambda t: t[None]},
    "indices repeated": {"state_indices": lambda t: torch.full_like(t, 1)},
}


def raised(function, args, kwargs) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as info:
        function(*args, **kwargs)
    return info.type, str(info.value)


@pytest.mark.parametrize("change", list(BAD_RECURRENT))
def test_recurrent_bad_argument_raises_the_goldens_error_before_writing(kernels, change):
    case = build_recurrent_case(3, seed=1)
    args, kwargs = with_changes(RECURRENT_NAMES, case, BAD_RECURRENT[change])
    expected = raised(golden_recurrent_step, args, kwargs)
    state = args[5]
    before = state.clone() if isinstance(state, torch.Tensor) else None
    assert raised(kernels.recurrent_step, args, kwargs) == expected
    if before is not None:
        assert same_bits(state, before)


@pytest.mark.parametrize("change", list(BAD_CONV))
def test_conv_bad_argument_raises_the_goldens_error_before_writing(kernels, change):
    case = build_conv_case(3, with_bias=True)
    args, kwargs = with_changes(CONV_NAMES, case, BAD_CONV[change])
    expected = raised(golden_conv_update, args, kwargs)
    state = args[1]
    before = state.clone()
    assert raised(kernels.conv_update, args, kwargs) == expected
    assert same_bits(state, before)


def recurrent_errors(kernels, change) -> tuple[tuple[type, str], tuple[type, str]]:
    """(kernel's error, golden's error) for one bad recurrent argument."""
    args, kwargs = with_changes(
        RECURRENT_NAMES, build_recurrent_case(3, seed=1), BAD_RECURRENT[change]
    )
    return raised(kernels.recurrent_step, args, kwargs), raised(golden_recurrent_step, args, kwargs)


def conv_errors(kernels, change) -> tuple[tuple[type, str], tuple[type, str]]:
    """(kernel's error, golden's error) for one bad conv argument."""
    args, kwargs = with_changes(CONV_NAMES, build_conv_case(3, with_bias=True), BAD_CONV[change])
    return raised(kernels.conv_update, args, kwargs), raised(golden_conv_update, args, kwargs)


def reworded(check):
    """``check`` raising each of its errors with another message."""

    @functools.wraps(check)
    def mirror(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{error}.") from None

    return mirror


def retyped(check):
    """``check`` raising each of its errors as the other type, with the same message."""

    @functools.wraps(check)
    def mirror(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except TypeError as error:
            raise ValueError(str(error)) from None
        except ValueError as error:
            raise TypeError(str(error)) from None

    return mirror


@pytest.mark.parametrize("mirror", [reworded, retyped])
def test_kernels_raising_other_errors_than_the_goldens_fail_the_comparison(
    kernels, monkeypatch, mirror
):
    for name in ("check_recurrent_dims", "check_conv_dims", "check_state_index_values"):
        monkeypatch.setattr(golden_package, name, mirror(getattr(golden_package, name)))
    assert all(a != b for a, b in (recurrent_errors(kernels, c) for c in BAD_RECURRENT))
    assert all(a != b for a, b in (conv_errors(kernels, c) for c in BAD_CONV))


def test_the_goldens_checks_come_before_the_kernels_limits(kernels):
    case = build_recurrent_case(2, seed=2)
    case.state = case.state[:1].expand(case.state.shape[0], -1, -1, -1)  # overlapping
    args, kwargs = with_changes(RECURRENT_NAMES, case, {"scale": float("nan")})
    assert raised(kernels.recurrent_step, args, kwargs) == raised(
        golden_recurrent_step, args, kwargs
    )
    conv = build_conv_case(2)
    conv.conv_state = conv.conv_state[:, :, :1].expand(-1, -1, 3)  # overlapping
    args, kwargs = with_changes(CONV_NAMES, conv, {"activation": "relu"})
    assert raised(kernels.conv_update, args, kwargs) == raised(golden_conv_update, args, kwargs)


def test_overlapping_state_is_refused_before_writing(kernels):
    case = build_recurrent_case(2, seed=2)
    case.state = case.state[:1].expand(case.state.shape[0], -1, -1, -1)  # one block, many views
    case.state_indices = torch.tensor([1, 2], dtype=torch.int32)
    before = case.state.clone()
    with pytest.raises(ValueError, match="state has overlapping elements"):
        kernels.recurrent_step(*case.args(), **case.kwargs)
    assert same_bits(case.state, before)
    conv = build_conv_case(2)
    conv.conv_state = conv.conv_state[:, :, :1].expand(-1, -1, 3)
    with pytest.raises(ValueError, match="conv_state has overlapping elements"):
        kernels.conv_update(*conv.args(), **conv.kwargs)


@pytest.mark.skipif(compiled_kernels.recurrent.INTERPRETED, reason="TRITON_INTERPRET=1 is set")
def test_compiled_kernels_refuse_cpu_tensors_with_a_clear_error():
    case = build_recurrent_case(2, seed=3)
    before = case.state.clone()
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        compiled_kernels.recurrent_step(*case.args(), **case.kwargs)
    assert same_bits(case.state, before)
    conv = build_conv_case(2)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        compiled_kernels.conv_update(*conv.args(), **conv.kwargs)
