"""replay_response checks its arguments before anything runs, with the goldens' errors.

For an argument the goldens check, the expected error is what the goldens' own checks raise on
it (golden.check_conv_args, then golden.check_recurrent_args, x standing for mixed_qkv,
conv_weight for weight, conv_bias for bias), compared by type and message. The replay's own
checks (the number of sequences, cu_seqlens, devices, the gradient's state dtype) come after.
"""

import pytest
import torch

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.replay import checks as checks_module
from vllm_gdn_invariant.replay import prompt_state, replay_response
from vllm_gdn_invariant.replay import response as response_module
from vllm_gdn_invariant.replay.checks import check_replay_args

from .helpers import build_case, offsets

LENGTHS = [3, 1, 0, 4]
META = torch.device("meta")


class Computed(Exception):
    """Raised by a patched forward: the call got past its checks."""


@pytest.fixture
def no_forward(monkeypatch):
    def refuse(*args, **kwargs):
        raise Computed

    monkeypatch.setattr(response_module, "replay_with_goldens", refuse)


def goldens_error(case) -> Exception:
    """What the goldens' checks raise on the case's arguments (x as mixed_qkv)."""
    kw = case.kwargs
    rows = torch.zeros(case.x.shape[0] if case.x.ndim else 0, dtype=torch.int32)
    try:
        golden.check_conv_args(
            case.x, case.conv_state, case.conv_weight, rows, bias=case.conv_bias,
            activation=kw["activation"], dim_first=True,
        )  # fmt: skip
        golden.check_recurrent_args(
            case.x, case.a, case.b, case.A_log, case.dt_bias, case.state, rows,
            num_k_heads=kw["num_k_heads"], scale=kw["scale"], use_qk_l2norm=kw["use_qk_l2norm"],
        )  # fmt: skip
    except (TypeError, ValueError) as error:
        return error
    raise AssertionError("the goldens accept this case")


def base():
    return build_case(LENGTHS, seed=1, with_bias=True)


GOLDEN_CHECKED = {
    "x 1-D": lambda c: c.with_changes(x=c.x[0]),
    "x int": lambda c: c.with_changes(x=c.x.to(torch.int32)),
    "x width": lambda c: c.with_changes(x=c.x[:, 1:], conv_weight=c.conv_weight[1:],
                                        conv_state=c.conv_state[:, 1:], conv_bias=c.conv_bias[1:]),
    "a rows": lambda c: c.with_changes(a=c.a[1:]),
    "b heads": lambda c: c.with_changes(b=c.b[:, 1:]),
    "A_log list": lambda c: c.with_changes(A_log=c.A_log.tolist()),
    "dt_bias shape": lambda c: c.with_changes(dt_bias=c.dt_bias[:2]),
    "conv_weight one tap": lambda c: c.with_changes(conv_weight=c.conv_weight[:, :1]),
    "conv_state taps": lambda c: c.with_changes(conv_state=c.conv_state[:, :, :2]),
    "conv_state int": lambda c: c.with_changes(conv_state=c.conv_state.to(torch.int16)),
    "conv_bias shape": lambda c: c.with_changes(conv_bias=c.conv_bias[:3]),
    "state float16": lambda c: c.with_changes(state=c.state.half()),
    "state heads": lambda c: c.with_changes(state=c.state[:, :2]),
    "state K": lambda c: c.with_changes(state=c.state[..., :3]),
    "activation": lambda c: c.with_changes(kwargs={**c.kwargs, "activation": "relu"}),
    "num_k_heads": lambda c: c.with_changes(kwargs={**c.kwargs, "num_k_heads": 3}),
    "scale NaN": lambda c: c.with_changes(kwargs={**c.kwargs, "scale": float("nan")}),
    "use_qk_l2norm int": lambda c: c.with_changes(kwargs={**c.kwargs, "use_qk_l2norm": 1}),
}  # fmt: skip


@pytest.mark.parametrize("change", GOLDEN_CHECKED.values(), ids=GOLDEN_CHECKED.keys())
def test_the_goldens_error_for_what_the_goldens_check(change, no_forward):
    case = change(base())
    expected = goldens_error(case)
    with pytest.raises(type(expected)) as raised:
        replay_response(*case.args(), **case.all_kwargs())
    assert str(raised.value) == str(expected)


REPLAY_CHECKED = {
    "state sequences": (
        lambda c: c.with_changes(state=c.state[1:]),
        ValueError, r"state has 3 sequences \(shape\[0\]\) but conv_state has 4",
    ),
    "cu_seqlens float": (
        lambda c: c.with_changes(cu_seqlens=c.cu_seqlens.float()),
        TypeError, r"cu_seqlens must have dtype in \(torch.int32, torch.int64\)",
    ),
    "cu_seqlens 2-D": (
        lambda c: c.with_changes(cu_seqlens=c.cu_seqlens[None]),
        ValueError, r"cu_seqlens must be 1-D",
    ),
    "cu_seqlens length": (
        lambda c: c.with_changes(cu_seqlens=c.cu_seqlens[:-1]),
        ValueError, r"cu_seqlens must have shape \[S\+1\] \(S = conv_state.shape\[0\]\) = \(5,\)",
    ),
    "cu_seqlens start": (
        lambda c: c.with_changes(cu_seqlens=c.cu_seqlens + 1),
        ValueError, r"cu_seqlens must start at 0, got 1",
    ),
    "cu_seqlens decreasing": (
        lambda c: c.with_changes(cu_seqlens=torch.tensor([0, 3, 2, 4, 8], dtype=torch.int32)),
        ValueError, r"non-decreasing; it decreases over sequences \[1\]",
    ),
    "cu_seqlens end": (
        lambda c: c.with_changes(cu_seqlens=offsets([3, 1, 0, 3])),
        ValueError, r"cu_seqlens must end at N = x.shape\[0\] = 8, got 7",
    ),
    "a on another device": (
        lambda c: c.with_changes(a=c.a.to(META)),
        ValueError, r"a is on meta, but x is on cpu",
    ),
    "conv_bias on another device": (
        lambda c: c.with_changes(conv_bias=c.conv_bias.to(META)),
        ValueError, r"conv_bias is on meta, but x is on cpu",
    ),
    "cu_seqlens on another device": (
        lambda c: c.with_changes(cu_seqlens=c.cu_seqlens.to(META)),
        ValueError, r"cu_seqlens is on meta, but x is on cpu \(cu_seqlens may be on x's device",
    ),
}  # fmt: skip


@pytest.mark.parametrize("change, error, message", REPLAY_CHECKED.values(), ids=REPLAY_CHECKED)
def test_the_replays_own_checks(change, error, message, no_forward):
    case = change(base())
    with pytest.raises(error, match=message):
        replay_response(*case.args(), **case.all_kwargs())


def test_a_valid_call_gets_past_the_checks(no_forward):
    case = base()
    with pytest.raises(Computed):
        replay_response(*case.args(), **case.all_kwargs())


def test_the_checks_read_no_tensor_memory_but_cu_seqlens():
    """Every tensor but cu_seqlens on the meta device, which has no memory to read: the
    checks still pass (so on a GPU they wait for nothing but a GPU-resident cu_seqlens)."""
    case = base()
    on_meta = {name: t.to(META) for name, t in case.tensors().items() if name != "cu_seqlens"}
    case = case.with_changes(**on_meta)
    checked = check_replay_args(*case.args(), **case.all_kwargs())
    assert checked.plan.lengths == tuple(LENGTHS)
    assert checked.dims.scale == torch.tensor(case.kwargs["scale"]).item()


def test_cu_seqlens_values_are_read_once(monkeypatch):
    case = base()
    reads = []
    tolist = torch.Tensor.tolist

    def counting(self):
        reads.append(tuple(self.shape))
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    checks_module.check_replay_args(*case.args(), **case.all_kwargs())
    assert reads == [(len(LENGTHS) + 1,)]


def prompt_call(case, **changes):
    kwargs = {
        "num_k_heads": case.kwargs["num_k_heads"],
        "head_k_dim": case.state.shape[3],
        "head_v_dim": case.state.shape[2],
        "conv_bias": case.conv_bias,
        **changes,
    }
    args = (case.x, case.a, case.b, case.A_log, case.dt_bias, case.conv_weight, case.cu_seqlens)
    return prompt_state(*args, **kwargs)


PROMPT_CHECKED = {
    "one state of two": (
        dict(state=base().state), ValueError,
        r"pass both conv_state and state .* or neither .*; got state without conv_state",
    ),
    "bfloat16 state": (
        dict(conv_state=base().conv_state, state=base().state.bfloat16()),
        TypeError, r"state must be float32 \(the plugin's recurrent state",
    ),
    "head_v_dim": (
        dict(head_v_dim=4), ValueError,
        r"x has width 48, but 2\*H\*K \+ HV\*V = 44 for num_k_heads=2, head_k_dim=7, "
        r"head_v_dim=4 and HV=4 \(A_log.shape\[0\]\)",
    ),
    "head_k_dim with states": (
        dict(conv_state=base().conv_state, state=base().state, head_k_dim=6), ValueError,
        r"state has V=5, K=7 \(shape\[2:\]\), but head_v_dim=5, head_k_dim=6",
    ),
    "head_k_dim 0": (dict(head_k_dim=0), ValueError, r"head_k_dim must be > 0, got 0"),
    "conv_state_dtype with states": (
        dict(conv_state=base().conv_state, state=base().state, conv_state_dtype=torch.float32),
        ValueError, r"conv_state_dtype=torch.float32 is for a fresh prompt",
    ),
    "conv_state_dtype int": (
        dict(conv_state_dtype=torch.int8), TypeError, r"conv_state_dtype must be one of",
    ),
    "float32 x": (
        dict(x_dtype=torch.float32), TypeError, r"x must be bfloat16 or float16 for vLLM's chunk",
    ),
    "a CPU tensor": (
        {}, ValueError, r"x is on cpu; prompt_state runs vLLM's Triton prefill kernels, on CUDA",
    ),
}  # fmt: skip


@pytest.mark.parametrize("changes, error, message", PROMPT_CHECKED.values(), ids=PROMPT_CHECKED)
def test_prompt_state_checks(changes, error, message):
    case = base()
    if "x_dtype" in changes:
        case = case.with_changes(x=case.x.to(changes.pop("x_dtype")))
    with pytest.raises(error, match=message):
        prompt_call(case, **changes)
