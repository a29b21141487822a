"""The kernels keep the metadata checks' verdict per argument signature
(validation.CheckedSignatures).

A call whose arguments have the signature of an earlier passing call's (each tensor's type,
dtype, shape and device, each other argument's type and value, a float's sign, whether the
kernels are interpreted) repeats no metadata check; any other call behaves exactly as with an
empty cache: the golden's error, or the dims a fresh check gives. Negative controls: caches
whose keys drop the types, a float's sign, the devices or the interpreted flag answer some of
the scenarios below with a kept verdict that a fresh check would not give.
"""

from __future__ import annotations

import math

import pytest
import torch

import vllm_gdn_invariant.golden as golden_package

from ..golden.helpers import build_conv_case, build_recurrent_case

META = torch.device("meta")


class LookAlike:
    """Not a tensor, with a tensor's dtype, shape and device."""

    def __init__(self, tensor: torch.Tensor):
        self.dtype, self.shape, self.device = tensor.dtype, tensor.shape, tensor.device


def recurrent_call(**changes):
    case = build_recurrent_case(3, H=1, HV=2, K=8, V=4, seed=1)
    args = dict(zip(["mixed_qkv", "a", "b", "A_log", "dt_bias", "state", "state_indices"],
                    case.args(), strict=True))  # fmt: skip
    kwargs = dict(case.kwargs)
    for name, value in changes.items():
        target = args if name in args else kwargs
        target[name] = value(target[name]) if callable(value) else value
    return "recurrent", list(args.values()), kwargs


def conv_call(**changes):
    case = build_conv_case(3, dim=16, seed=1)
    args = dict(zip(["x", "conv_state", "weight", "state_indices"], case.args(), strict=True))
    kwargs = dict(case.kwargs)
    for name, value in changes.items():
        target = args if name in args else kwargs
        target[name] = value(target[name]) if callable(value) else value
    return "conv", list(args.values()), kwargs


# (first call, which passes; second call): the second must behave as with an empty cache.
SCENARIOS = {
    "scale 0.0 then -0.0": (recurrent_call(scale=0.0), recurrent_call(scale=-0.0)),
    "num_k_heads 1 then True": (recurrent_call(), recurrent_call(num_k_heads=True)),
    "use_qk_l2norm True then 1": (recurrent_call(), recurrent_call(use_qk_l2norm=1)),
    "state then on another device": (recurrent_call(), recurrent_call(state=lambda t: t.to(META))),
    "x then a look-alike": (conv_call(), conv_call(x=LookAlike)),
    "dim_first True then 1": (conv_call(), conv_call(dim_first=1)),
    "weight then int": (conv_call(), conv_call(weight=lambda t: t.to(torch.int32))),
    "interpreted then compiled": (
        conv_call(interpreted=True),
        conv_call(interpreted=False),
    ),
}


def validate(kernels, call):
    op, args, kwargs = call
    check = (
        kernels.validation.check_recurrent_args
        if op == "recurrent"
        else kernels.validation.check_conv_args
    )
    return check(*args, **({"interpreted": True} | kwargs))


def outcome(kernels, call) -> tuple:
    """The error's type and message, or the dims (repr keeps a zero's sign)."""
    try:
        return ("dims", repr(validate(kernels, call)))
    except (TypeError, ValueError) as error:
        return (type(error), str(error))


@pytest.fixture
def fresh(kernels, monkeypatch):
    """Empty verdict caches for the test."""
    validation = kernels.validation
    monkeypatch.setattr(validation, "CHECKED_SIGNATURES", validation.CheckedSignatures())
    monkeypatch.setattr(validation, "CHECKED_INDICES", validation.CheckedIndices())
    return validation.CHECKED_SIGNATURES


@pytest.fixture
def metadata_checks(monkeypatch) -> list:
    """Counts the calls of golden.check_recurrent_dims and golden.check_conv_dims."""
    calls = []
    for name in ("check_recurrent_dims", "check_conv_dims"):
        check = getattr(golden_package, name)

        def counted(*args, _check=check, _name=name, **kwargs):
            calls.append(_name)
            return _check(*args, **kwargs)

        monkeypatch.setattr(golden_package, name, counted)
    return calls


def after_a_kept_verdict(kernels, scenario) -> tuple:
    first, second = SCENARIOS[scenario]
    assert outcome(kernels, first)[0] == "dims"  # passes: its verdict is kept
    return outcome(kernels, second)


def with_empty_cache(kernels, scenario) -> tuple:
    kernels.validation.CHECKED_SIGNATURES.clear()
    return outcome(kernels, SCENARIOS[scenario][1])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_call_after_a_kept_verdict_behaves_as_with_an_empty_cache(kernels, fresh, scenario):
    assert after_a_kept_verdict(kernels, scenario) == with_empty_cache(kernels, scenario)


def test_the_scenarios_include_passing_calls_with_other_dims(kernels, fresh):
    """-0.0 passes and gives dims of another scale sign than 0.0's (the cache must not answer
    it with 0.0's dims)."""
    first, second = SCENARIOS["scale 0.0 then -0.0"]
    assert math.copysign(1.0, validate(kernels, first).scale) == 1.0
    kernels.validation.CHECKED_SIGNATURES.clear()
    assert math.copysign(1.0, validate(kernels, second).scale) == -1.0


@pytest.mark.parametrize("op", ["recurrent", "conv"])
def test_a_call_with_a_kept_signature_runs_no_metadata_check(kernels, fresh, metadata_checks, op):
    make = recurrent_call if op == "recurrent" else conv_call
    first = validate(kernels, make())
    second = validate(kernels, make())  # new tensors of the same signature
    assert repr(first) == repr(second)
    assert len(metadata_checks) == 1


def test_a_parameter_has_its_own_signature_and_passes(kernels, fresh, metadata_checks):
    validate(kernels, conv_call())
    parameter = conv_call(weight=lambda t: torch.nn.Parameter(t, requires_grad=False))
    assert repr(validate(kernels, parameter)) == repr(validate(kernels, conv_call()))
    assert len(metadata_checks) == 2


def test_failing_calls_are_never_kept(kernels, fresh):
    for call in (recurrent_call(scale=float("nan")), conv_call(activation="relu")):
        with pytest.raises(ValueError):
            validate(kernels, call)
    assert fresh.verdicts == {}


def test_unhashable_arguments_are_checked_every_time(kernels, fresh, metadata_checks):
    call = conv_call(activation=["silu"])
    for _ in range(2):
        with pytest.raises(TypeError, match="activation must be None or a str"):
            validate(kernels, call)
    assert len(metadata_checks) == 2
    assert fresh.verdicts == {}


def test_the_oldest_verdict_goes_beyond_capacity(kernels, monkeypatch, metadata_checks):
    validation = kernels.validation
    monkeypatch.setattr(validation, "CHECKED_SIGNATURES", validation.CheckedSignatures(2))
    calls = [conv_call(), conv_call(dim_first=True, activation=None), recurrent_call()]
    for call in calls:
        validate(kernels, call)
    assert len(validation.CHECKED_SIGNATURES.verdicts) == 2
    validate(kernels, calls[2])
    validate(kernels, calls[1])
    assert len(metadata_checks) == 3  # both still kept
    validate(kernels, calls[0])
    assert len(metadata_checks) == 4  # dropped: checked again


# --- negative controls: lossy keys answer some scenario wrongly -------------------------------


def without(kind):
    """A key transform that forgets ``kind`` everywhere in the key."""

    def forget(value):
        if isinstance(value, tuple) and not isinstance(value, torch.Size):
            return tuple(forget(v) for v in value)
        if kind == "types" and isinstance(value, type):
            return None
        if kind == "sign" and isinstance(value, float):
            return abs(value)
        if kind == "devices" and isinstance(value, torch.device):
            return None
        return value

    if kind == "interpreted":
        return lambda key: key[:1] + key[2:]
    return forget


class LossyCache:
    """A CheckedSignatures whose keys go through a lossy transform first."""

    def __init__(self, cache, transform):
        self.cache, self.transform = cache, transform

    def verdict(self, key, check):
        return self.cache.verdict(self.transform(key), check)

    def clear(self):
        self.cache.clear()


LOSSES = {
    "types": ["num_k_heads 1 then True", "use_qk_l2norm True then 1", "dim_first True then 1"],
    "sign": ["scale 0.0 then -0.0"],
    "devices": ["state then on another device"],
    "interpreted": ["interpreted then compiled"],
}


@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_cache_with_lossy_keys_answers_the_scenarios_wrongly(kernels, monkeypatch, loss):
    validation = kernels.validation
    lossy = LossyCache(validation.CheckedSignatures(), without(loss))
    monkeypatch.setattr(validation, "CHECKED_SIGNATURES", lossy)
    monkeypatch.setattr(validation, "CHECKED_INDICES", validation.CheckedIndices())
    for scenario in LOSSES[loss]:
        kept = after_a_kept_verdict(kernels, scenario)
        assert kept == ("dims", outcome(kernels, SCENARIOS[scenario][0])[1])  # the kept answer
        assert kept != with_empty_cache(kernels, scenario)


def test_a_numpy_zero_scale_keeps_its_sign(kernels, fresh):
    """np.float32 is a real number but no float: -0.0 and 0.0 of it are equal, hash alike, and
    give scales of other signs."""
    np = pytest.importorskip("numpy")
    first = validate(kernels, recurrent_call(scale=np.float32(0.0)))
    second = validate(kernels, recurrent_call(scale=np.float32(-0.0)))
    assert math.copysign(1.0, first.scale) == 1.0
    assert math.copysign(1.0, second.scale) == -1.0
