"""Launcher: a launch key's first launch goes through Triton's JIT launcher, later ones call the
compiled kernel it returned, with the arguments the JIT launcher would bind.

The launch key must refine Triton's specialization (equal keys, equal specialization), or a
compiled kernel would run on arguments it was not specialized for: checked against Triton's own
specialization function over launches that differ in alignment, strides, dtypes and sizes, with
a negative control (a key without the pointers' alignment is not a refinement). A fake kernel
pins the cache: one JIT launch per key, every change of a key's part a new JIT launch, the grid
padded to three dimensions. Under the interpreter every launch is the interpreter's.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.nvidia.compiler import CUDABackend

import vllm_gdn_invariant.kernels.conv as compiled_conv
import vllm_gdn_invariant.kernels.recurrent as compiled_recurrent
from vllm_gdn_invariant.kernels.launch import Launcher, cdiv, launch_key, next_power_of_2
from vllm_gdn_invariant.kernels.validation import ConvDims, RecurrentDims

try:  # Triton's specialization of one launch argument (what its JIT launcher's binder calls)
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # pragma: no cover - another Triton than 3.6 to 3.9
    native_specialize_impl = None

CPU = torch.device("cpu")


def triton_specialization(arguments: tuple) -> tuple:
    """Triton's (type, attribute) of each non-constexpr argument."""
    return tuple(native_specialize_impl(CUDABackend, a, False, True, True) for a in arguments)


def offset_view(shape: tuple[int, ...], dtype: torch.dtype, offset: int) -> torch.Tensor:
    """A contiguous tensor of ``shape`` starting ``offset`` elements into a buffer."""
    size = 1
    for n in shape:
        size *= n
    return torch.zeros(size + offset, dtype=dtype)[offset:].view(shape)


def recurrent_launches() -> list[tuple[tuple, dict]]:
    """(arguments, constexprs) of the recurrent kernel over alignments, strides, dtypes and
    sizes."""
    launches = []
    for batch, HV, state_dtype, qkv_offset, state_offset, column_step, index_step in (
        itertools.product((1, 16), (2, 32), (torch.float32, torch.bfloat16), (0, 1, 8), (0, 2),
                          (1, 2), (1, 2))
    ):  # fmt: skip
        H, K, V = 1, 16, 8
        width = 2 * H * K + HV * V
        wide = offset_view((batch, width * column_step), torch.bfloat16, qkv_offset)
        mixed_qkv = wide[:, ::column_step]
        gates = torch.zeros(batch, HV, dtype=torch.bfloat16)
        state = offset_view((batch + 1, HV, V, K), state_dtype, state_offset)
        indices = torch.zeros(batch * index_step, dtype=torch.int32)[::index_step]
        out = torch.zeros(batch, 1, HV, V, dtype=torch.bfloat16)
        dims = RecurrentDims(batch, H, HV, K, V, 0.25, True)
        config = compiled_recurrent.recurrent_config(dims, state_dtype, interpreted=False)
        heads = torch.zeros(HV)
        _, arguments, constexprs = compiled_recurrent.kernel_arguments(
            mixed_qkv, gates, gates, heads, heads, out, state, indices, dims, config
        )
        launches.append((arguments, constexprs))
    return launches


def conv_launches() -> list[tuple[tuple, dict]]:
    """(arguments, constexprs) of the conv kernel over alignments, sizes, dtypes, layouts."""
    launches = []
    for dim, cache_dtype, x_offset, dim_first, with_bias in itertools.product(
        (16, 24), (torch.float32, torch.bfloat16), (0, 3), (True, False), (True, False)
    ):
        dims = ConvDims(2, dim, 4, dim_first, True)
        x = offset_view((2, dim), torch.bfloat16, x_offset)
        shape = (3, dim, 3) if dim_first else (3, 3, dim)
        weight = torch.zeros(dim, 4, dtype=torch.bfloat16)
        bias = torch.zeros(dim, dtype=torch.bfloat16) if with_bias else None
        _, arguments, constexprs = compiled_conv.kernel_arguments(
            x,
            torch.zeros(shape, dtype=cache_dtype),
            weight,
            torch.zeros(2, dtype=torch.int32),
            bias,
            torch.zeros(2, dim, dtype=torch.bfloat16),
            dims,
            compiled_conv.conv_config(dims, interpreted=False),
        )
        launches.append((arguments, constexprs))
    return launches


def refinement_failures(launches: list[tuple[tuple, dict]], key) -> list[tuple[int, int]]:
    """Pairs of launches with one key but two Triton specializations."""
    by_key: dict[tuple, tuple[int, tuple]] = {}
    failures = []
    for n, (arguments, _) in enumerate(launches):
        spec = triton_specialization(arguments)
        first = by_key.setdefault(key(arguments), (n, spec))
        if first[1] != spec:
            failures.append((first[0], n))
    return failures


def our_key(arguments: tuple) -> tuple:
    tensors = sum(isinstance(a, torch.Tensor) for a in arguments)
    return launch_key(arguments, tensors, (), 4, CPU)


def key_without_alignment(arguments: tuple) -> tuple:
    return tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in arguments)


needs_specializer = pytest.mark.skipif(
    native_specialize_impl is None, reason="this Triton has no native_specialize_impl"
)


@needs_specializer
@pytest.mark.parametrize("launches", [recurrent_launches, conv_launches], ids=["recurrent", "conv"])
def test_the_launch_key_refines_tritons_specialization(launches):
    launches = launches()
    assert refinement_failures(launches, our_key) == []
    specializations = {triton_specialization(arguments) for arguments, _ in launches}
    assert len(specializations) >= 8  # the launches do differ in Triton's eyes


@needs_specializer
def test_a_key_without_the_pointers_alignment_is_not_a_refinement():
    assert refinement_failures(recurrent_launches(), key_without_alignment) != []


@pytest.mark.parametrize(
    "module, kernel_name",
    [(compiled_recurrent, "recurrent_step_kernel"), (compiled_conv, "conv_update_kernel")],
)
def test_the_direct_launch_passes_every_parameter_in_order_as_tritons_binder(module, kernel_name):
    kernel = getattr(module, kernel_name)
    launches = recurrent_launches() if module is compiled_recurrent else conv_launches()
    arguments, constexprs = launches[-1]
    launcher = Launcher(kernel, tensors=0)
    direct = (*arguments, *launcher.constexpr_values(arguments, constexprs))
    bound = inspect.signature(kernel.fn).bind(*arguments, **constexprs)
    bound.apply_defaults()
    assert direct == tuple(bound.arguments.values())


class FakeCompiled:
    """Records its direct launches: ``compiled[grid](*arguments)``."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *arguments: self.launches.append((grid, arguments))


class FakeKernel:
    """A JIT kernel ``kernel(x, n, BLOCK: constexpr)`` recording its JIT launches."""

    arg_names = ["x", "n", "BLOCK"]

    def __init__(self):
        self.launches, self.compiled = [], []

    def __getitem__(self, grid):
        def run(*arguments, **options):
            self.launches.append((grid, arguments, options))
            self.compiled.append(FakeCompiled())
            return self.compiled[-1]

        return run


def test_a_keys_later_launches_call_its_compiled_kernel_directly():
    kernel = FakeKernel()
    launcher = Launcher(kernel, tensors=1, direct=True)
    x = torch.zeros(8)
    device = torch.device("cuda", 0)  # a device object; nothing runs on it
    first = launcher.launch((4,), (x, 3), {"BLOCK": 16}, 4, device)
    second = launcher.launch((5,), (x, 3), {"BLOCK": 16}, 4, device)
    assert first is second is kernel.compiled[0]
    assert kernel.launches == [
        ((4,), (x, 3), {"BLOCK": 16, "num_warps": 4, "enable_fp_fusion": False})
    ]
    assert first.launches == [((5, 1, 1), (x, 3, 16))]


def test_every_part_of_the_key_selects_another_compiled_kernel():
    kernel = FakeKernel()
    launcher = Launcher(kernel, tensors=1, direct=True)
    buffer = torch.zeros(16)
    x = buffer[:8]
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    base = ((x, 3), {"BLOCK": 16}, 4, cuda0)
    variants = {
        "base": base,
        "misaligned pointer": ((buffer[1:9], 3), {"BLOCK": 16}, 4, cuda0),
        "dtype": ((x.to(torch.bfloat16), 3), {"BLOCK": 16}, 4, cuda0),
        "int value": ((x, 17), {"BLOCK": 16}, 4, cuda0),
        "int equal to 1": ((x, 1), {"BLOCK": 16}, 4, cuda0),
        "constexpr": ((x, 3), {"BLOCK": 32}, 4, cuda0),
        "constexpr dtype": ((x, 3), {"BLOCK": tl.bfloat16}, 4, cuda0),
        "num_warps": ((x, 3), {"BLOCK": 16}, 8, cuda0),
        "device": ((x, 3), {"BLOCK": 16}, 4, cuda1),
    }
    for arguments, constexprs, num_warps, device in variants.values():
        launcher.launch((1,), arguments, constexprs, num_warps, device)
    assert len(kernel.launches) == len(variants)
    same_metadata_other_tensor = (torch.zeros(8), 3)  # another aligned fp32 tensor: same key
    launcher.launch((1,), same_metadata_other_tensor, {"BLOCK": 16}, 4, cuda0)
    assert len(kernel.launches) == len(variants)
    assert kernel.compiled[0].launches == [((1, 1, 1), (*same_metadata_other_tensor, 16))]


def test_a_jit_launch_that_returns_nothing_is_not_kept():
    class Returns(FakeKernel):
        def __getitem__(self, grid):
            return lambda *arguments, **options: self.launches.append(arguments)

    kernel = Returns()
    launcher = Launcher(kernel, tensors=1, direct=True)
    for _ in range(2):
        launcher.launch((1,), (torch.zeros(4), 3), {"BLOCK": 16}, 4, torch.device("cuda", 0))
    assert len(kernel.launches) == 2 and launcher.compiled == {}


def test_a_tensor_among_the_scalars_is_refused_before_the_first_launch():
    kernel = FakeKernel()
    launcher = Launcher(kernel, tensors=1, direct=True)
    with pytest.raises(TypeError, match="leading tensor arguments"):
        launcher.launch((1,), (torch.zeros(4), torch.zeros(1)), {"BLOCK": 16}, 4, CPU)
    assert kernel.launches == []


@pytest.mark.parametrize("leading", [None, 3, 2.5], ids=["none", "int", "float"])
def test_a_scalar_among_the_leading_tensors_is_refused_by_name_before_the_first_launch(leading):
    kernel = FakeKernel()
    launcher = Launcher(kernel, tensors=2, direct=True)
    with pytest.raises(TypeError, match=r"takes 2 leading tensor arguments, got tensors at \[0\]"):
        launcher.launch((1,), (torch.zeros(4), leading), {"BLOCK": 16}, 4, CPU)
    assert kernel.launches == []


@pytest.mark.parametrize("module", [compiled_recurrent, compiled_conv], ids=["recurrent", "conv"])
def test_the_kernels_launchers_count_their_leading_tensors(module):
    launcher = getattr(
        module, "LAUNCH_RECURRENT" if module is compiled_recurrent else "LAUNCH_CONV"
    )
    launches = recurrent_launches() if module is compiled_recurrent else conv_launches()
    for arguments, _ in launches:
        launcher.require_tensors_first(arguments)


def test_the_compiled_package_launches_directly_and_the_interpreted_one_never(kernels):
    assert compiled_recurrent.LAUNCH_RECURRENT.direct and compiled_conv.LAUNCH_CONV.direct
    assert not kernels.recurrent.LAUNCH_RECURRENT.direct
    assert not kernels.conv.LAUNCH_CONV.direct


def test_host_shape_helpers_are_tritons():
    values = [*range(-4, 4100), 2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3]
    assert [next_power_of_2(n) for n in values] == [triton.next_power_of_2(n) for n in values]
    pairs = [(x, y) for x in range(-3, 300) for y in (1, 2, 3, 16, 64, 256)]
    assert [cdiv(x, y) for x, y in pairs] == [triton.cdiv(x, y) for x, y in pairs]
