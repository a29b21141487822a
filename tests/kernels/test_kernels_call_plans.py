"""Repeated calls of the public functions (kernels/call_plans.py, Launcher.bind): a call with the
key of an earlier passing call launches that call's bound kernel with the arguments Triton's
binder would give it, after checking its index tensor; any other call is checked in full.

On CPU the compiled package's launchers get a fake JIT kernel (it records its launches and
returns a fake compiled kernel that records the direct ones) and every device counts as
runnable, so that the host path runs as on a GPU. Negative control: a call key without the
strides reuses a plan for a strided input, whose direct launch then differs from the binder's.
"""

from __future__ import annotations

import pytest
import torch

import vllm_gdn_invariant.kernels.call_plans as call_plans
import vllm_gdn_invariant.kernels.conv as compiled_conv
import vllm_gdn_invariant.kernels.recurrent as compiled_recurrent
import vllm_gdn_invariant.kernels.validation as validation
from vllm_gdn_invariant.kernels.launch import Launcher

from ..golden.helpers import build_conv_case, build_recurrent_case
from .test_kernels_launch import FakeKernel as FakeJitKernel
from .test_kernels_signature_checks import SCENARIOS


class FakeKernel(FakeJitKernel):
    """test_kernels_launch's fake JIT kernel with the parameter names of a real one."""

    def __init__(self, names):
        super().__init__()
        self.arg_names = names


LAUNCHERS = {
    "recurrent": compiled_recurrent.LAUNCH_RECURRENT,
    "conv": compiled_conv.LAUNCH_CONV,
}


@pytest.fixture
def fake_gpu(monkeypatch):
    """The compiled package's public functions on CPU tensors, launching fake kernels."""
    monkeypatch.setattr(validation, "runnable", lambda device, interpreted: True)
    monkeypatch.setattr(validation, "CHECKED_SIGNATURES", validation.CheckedSignatures())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # a CPU tensor's index
    kernels = {}
    for op, launcher in LAUNCHERS.items():
        kernels[op] = FakeKernel(launcher.names)
        monkeypatch.setattr(launcher, "kernel", kernels[op])
        monkeypatch.setattr(launcher, "compiled", {})
        monkeypatch.setattr(launcher, "bound", {})
    compiled_recurrent.CALL_PLANS.clear()
    yield kernels
    compiled_recurrent.CALL_PLANS.clear()


def reshaped_input(x: torch.Tensor, column_step: int, offset: int) -> torch.Tensor:
    """``x``'s values in a view with ``column_step`` between columns, ``offset`` elements into
    its buffer."""
    rows, columns = x.shape
    buffer = torch.zeros(offset + rows * columns * column_step, dtype=x.dtype)
    view = buffer[offset:].view(rows, columns * column_step)[:, ::column_step]
    view.copy_(x)
    return view


def recurrent_call(seed: int, column_step: int = 1, offset: int = 0):
    """Arguments of ``recurrent_step`` (fresh tensors), mixed_qkv laid out as
    ``reshaped_input``."""
    case = build_recurrent_case(3, H=1, HV=2, K=8, V=4, seed=seed)
    args = list(case.args())
    args[0] = reshaped_input(args[0], column_step, offset)
    return args, dict(case.kwargs)


def conv_call(seed: int, column_step: int = 1, offset: int = 0):
    """Arguments of ``conv_update`` (fresh tensors), x laid out as ``reshaped_input``."""
    case = build_conv_case(3, dim=16, seed=seed)
    args = list(case.args())
    args[0] = reshaped_input(args[0], column_step, offset)
    return args, dict(case.kwargs)


def call(op: str, args: list, kwargs: dict) -> torch.Tensor:
    if op == "recurrent":
        return compiled_recurrent.recurrent_step(*args, **kwargs)
    return compiled_conv.conv_update(*args, **kwargs)


def binders_launch(op: str, args: list, kwargs: dict, out: torch.Tensor) -> tuple:
    """Every parameter of the kernel, in order, as the JIT launcher binds them for this call
    (the tensors, then the scalars and constexprs of ``kernel_arguments``)."""
    if op == "recurrent":
        dims = validation.check_recurrent_args(*args, **kwargs, interpreted=False)
        config = compiled_recurrent.recurrent_config(dims, args[5].dtype, interpreted=False)
        _, arguments, constexprs = compiled_recurrent.kernel_arguments(
            *args[:5], out, args[5], args[6], dims, config
        )
    else:
        options = {"bias": None, "activation": "silu", "dim_first": True} | kwargs
        dims = validation.check_conv_args(*args, **options, interpreted=False)
        config = compiled_conv.conv_config(dims, interpreted=False)
        _, arguments, constexprs = compiled_conv.kernel_arguments(
            *args, options["bias"], out, dims, config
        )
    return (*arguments, *LAUNCHERS[op].constexpr_values(arguments, constexprs))


def same_arguments(first: tuple, second: tuple) -> bool:
    """Tensors by identity, every other argument by value and type."""
    if len(first) != len(second):
        return False
    for a, b in zip(first, second, strict=True):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if a is not b:
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


CALLS = {"recurrent": recurrent_call, "conv": conv_call}


@pytest.mark.parametrize("op", list(CALLS))
def test_a_repeated_call_key_launches_its_plan_as_the_binder_would(fake_gpu, op):
    first = CALLS[op](seed=1)
    call(op, *first)
    assert len(fake_gpu[op].launches) == 1  # checked in full, launched through the JIT launcher
    assert len(compiled_recurrent.CALL_PLANS.plans) == 1
    compiled = fake_gpu[op].compiled[0]
    for seed in (2, 3):  # fresh tensors, same call key
        args, kwargs = CALLS[op](seed=seed)
        out = call(op, args, kwargs)
        grid, launched = compiled.launches[-1]
        assert len(grid) == 3
        assert same_arguments(launched, binders_launch(op, args, kwargs, out))
    assert len(fake_gpu[op].launches) == 1 and len(compiled.launches) == 2


LAYOUTS = {"strides": {"column_step": 2}, "alignment": {"offset": 1}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("op", list(CALLS))
def test_another_layout_is_checked_and_launched_on_its_own(fake_gpu, op, layout):
    call(op, *CALLS[op](seed=1))
    args, kwargs = CALLS[op](seed=2, **LAYOUTS[layout])
    call(op, args, kwargs)
    assert len(fake_gpu[op].launches) == 2  # checked in full and launched on its own
    assert len(compiled_recurrent.CALL_PLANS.plans) == 2
    args, kwargs = CALLS[op](seed=3, **LAYOUTS[layout])
    out = call(op, args, kwargs)
    _, launched = fake_gpu[op].compiled[1].launches[-1]
    assert same_arguments(launched, binders_launch(op, args, kwargs, out))


def test_a_key_without_strides_would_launch_a_strided_input_wrongly(fake_gpu, monkeypatch):
    def lossy(op, tensors, options):
        key = call_plans.call_key(op, tensors, options)
        return (
            None
            if key is None
            else tuple(
                (k[0], k[1], k[2], k[4], k[5]) if isinstance(k, tuple) and len(k) == 6 else k
                for k in key
            )
        )

    monkeypatch.setattr(compiled_recurrent, "call_key", lossy)
    call("recurrent", *recurrent_call(seed=1))
    args, kwargs = recurrent_call(seed=2, column_step=2)
    out = call("recurrent", args, kwargs)
    assert len(fake_gpu["recurrent"].launches) == 1  # the lossy key reused the plan
    _, launched = fake_gpu["recurrent"].compiled[0].launches[-1]
    assert not same_arguments(launched, binders_launch("recurrent", args, kwargs, out))


@pytest.mark.parametrize("op", list(CALLS))
def test_bad_index_values_under_a_kept_plan_raise_before_any_launch(fake_gpu, op):
    call(op, *CALLS[op](seed=1))
    args, kwargs = CALLS[op](seed=2)
    index = 6 if op == "recurrent" else 3
    args[index] = args[index].clone()
    args[index][0] = 10_000  # past the state's blocks
    with pytest.raises(ValueError, match="state_indices"):
        call(op, args, kwargs)
    assert len(fake_gpu[op].launches) == 1 and fake_gpu[op].compiled[0].launches == []


MODULES = {"recurrent": compiled_recurrent, "conv": compiled_conv}
FULL_CHECKS = {"recurrent": "check_recurrent_args", "conv": "check_conv_args"}


@pytest.mark.parametrize("op", list(CALLS))
def test_an_output_of_another_alignment_under_a_plan_gets_a_launch_of_its_own_unchecked(
    fake_gpu, op, monkeypatch
):
    call(op, *CALLS[op](seed=1))
    module = MODULES[op]
    allocate = module.new_output

    def misaligned(source, dims):
        out = allocate(source, dims)
        return torch.empty(out.numel() + 1, dtype=out.dtype)[1:].view(out.shape)

    full_checks = []
    check = getattr(module, FULL_CHECKS[op])
    monkeypatch.setattr(module, "new_output", misaligned)
    monkeypatch.setattr(
        module, FULL_CHECKS[op], lambda *a, **k: full_checks.append(1) or check(*a, **k)
    )
    for seed in (2, 3):
        args, kwargs = CALLS[op](seed=seed)
        out = call(op, args, kwargs)
        assert out.data_ptr() & 15 != 0
    assert full_checks == []  # the plan's dims serve the other alignment too
    assert len(fake_gpu[op].launches) == 2  # bound once for the plan, once for the alignment
    _, launched = fake_gpu[op].compiled[1].launches[-1]
    assert same_arguments(launched, binders_launch(op, args, kwargs, out))
    assert len(compiled_recurrent.CALL_PLANS.plans) == 1


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "interpreted then compiled"])
def test_the_call_key_tells_apart_every_pair_the_signature_checks_tell_apart(scenario):
    """The call key refines the metadata checks' key (the interpreted flag is not in it: no plan
    is kept under the interpreter)."""
    (op, first, first_kwargs), (_, second, second_kwargs) = SCENARIOS[scenario]
    key_of = compiled_recurrent.recurrent_call_key if op == "recurrent" else None

    def key(args, kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k != "interpreted"}
        if key_of is not None:
            return key_of(*args, **kwargs)
        options = {"bias": None, "activation": "silu", "dim_first": True} | kwargs
        return compiled_conv.conv_call_key(*args, **options)

    assert key(first, first_kwargs) is not None
    assert key(first, first_kwargs) != key(second, second_kwargs)


def test_the_call_key_reads_each_tensors_layout_and_refuses_a_non_tensor():
    x = torch.zeros(4, 8)
    key = call_plans.call_key("op", (x, x[:, ::2], x[:, 1:]), ((int, 3),))
    layouts = key[1:4]
    assert [layout[3] for layout in layouts] == [(8, 1), (8, 2), (8, 1)]
    assert [layout[5] for layout in layouts] == [0, 0, 4]  # data pointer modulo 16
    assert key[4] == (int, 3)
    assert call_plans.call_key("op", (x, 3), ()) is None


def test_plans_beyond_capacity_and_unkeyable_calls_are_dropped():
    plans = call_plans.CallPlans(capacity=2)
    plan = call_plans.CallPlan(dims=None, bound=None, out_alignment=0)
    for n in range(3):
        plans.keep(("k", n), plan)
    assert list(plans.plans) == [("k", 1), ("k", 2)]
    plans.keep(None, plan)
    plans.keep(("unhashable", []), plan)
    assert len(plans.plans) == 2
    assert plans.get(None) is None and plans.get(("unhashable", [])) is None
    plans.clear()
    assert plans.get(("k", 2)) is None


def test_bind_keeps_a_direct_launch_and_launch_bound_replays_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel = FakeKernel(["x", "n", "BLOCK"])
    launcher = Launcher(kernel, tensors=1, direct=True)
    x, other = torch.zeros(8), torch.zeros(8)
    device = torch.device("cuda", 0)  # a device object; nothing runs on it
    bound = launcher.bind(("k",), (4,), (x, 3), {"BLOCK": 16}, num_warps=4, device=device)
    compiled = bound.compiled
    assert compiled is kernel.compiled[0]
    assert launcher.launch_bound(("k",), (other,)) is bound
    assert compiled.launches == [((4, 1, 1), (other, 3, 16))]
    assert launcher.launch_bound(("other key",), (other,)) is None
    assert len(compiled.launches) == 1


def test_an_interpreted_launcher_binds_nothing():
    kernel = FakeKernel(["x", "n", "BLOCK"])
    launcher = Launcher(kernel, tensors=1, direct=False)
    cpu = torch.device("cpu")
    bound = launcher.bind(("k",), (1,), (torch.zeros(4), 3), {"BLOCK": 16}, num_warps=4, device=cpu)
    assert bound is None and launcher.bound == {} and len(kernel.launches) == 1
