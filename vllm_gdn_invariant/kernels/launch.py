"""Launches of a kernel: FP contraction off, on the data's CUDA device, the compiled kernel
launched directly once Triton has bound a specialization.

Triton's JIT launcher (``kernel[grid](*args)``) binds every argument, computes the
specialization (each tensor's dtype and 16-byte alignment, each integer's width, whether it is 1
or a multiple of 16), builds the cache key, looks the compiled kernel up, checks the kernel's
globals and launches it, on every call. ``Launcher`` does that once per launch key: a key's
first launch goes through the JIT launcher, which returns the compiled kernel (Triton's
``CompiledKernel``); later launches with that key call ``compiled[grid](*arguments)``, the
compiled kernel's own launch, which makes the same driver call with the same arguments as the
JIT launcher. The bits are the same (the same compiled kernel runs on the same arguments); only
the host work differs.

A kernel's wrapper can also bind a launch to a key of its own (``bind``, ``launch_bound``): a
key from which the launch key, the grid and every argument after the leading tensors follow
(the wrapper's dims and launch shape, and each tensor's dtype, strides and data pointer modulo
16). A bound launch reuses that grid and those arguments, so the wrapper skips rebuilding them
and the launch key: ``launch_bound(key, tensors)`` is ``compiled[grid](*tensors, *trailing)``.

The launch key refines Triton's specialization: the device, ``num_warps``, every constexpr, each
tensor's dtype and data pointer modulo 16, and the exact value of every other argument. Two
launches with one key therefore have one specialization, and so one compiled kernel
(tests/kernels/test_kernels_launch.py checks the refinement against Triton's own specialization
function). Triton options read from the environment when a kernel is compiled (``TRITON_DEBUG``,
instrumentation) are those of the key's first launch. Under Triton's interpreter nothing is
compiled and every launch is the interpreter's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from triton.runtime import JITFunction

COMPILED_KERNELS = 1024  # launch keys (and bound launches) kept per kernel; all are dropped beyond


def cdiv(x: int, y: int) -> int:
    """``triton.cdiv`` on host integers, without its constexpr-function wrapper (a launch's
    host work)."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` on host integers, without its constexpr-function wrapper."""
    n -= 1
    for shift in (1, 2, 4, 8, 16, 32):
        n |= n >> shift
    return n + 1


def tensor_layouts(tensors: tuple) -> tuple:
    """Each tensor's dtype, strides and data pointer modulo 16: what a bound launch's key reads
    of the tensors it launches (their specialization and their strides, passed as scalars)."""
    return tuple([(t.dtype, t.stride(), t.data_ptr() & 15) for t in tensors])


class BoundLaunch:
    """A compiled kernel with its grid, every argument after the leading tensors and the device
    it runs on."""

    __slots__ = ("compiled", "grid", "trailing", "device_index")

    def __init__(self, compiled: object, grid: tuple, trailing: tuple, device_index: int) -> None:
        self.compiled = compiled
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.trailing = trailing
        self.device_index = device_index


def run_bound(bound: BoundLaunch, tensors: tuple) -> None:
    """Launch ``tensors`` (the leading arguments) with ``bound``, on its device."""
    if bound.device_index != torch.cuda.current_device():
        with torch.cuda.device(bound.device_index):
            bound.compiled[bound.grid](*tensors, *bound.trailing)
    else:
        bound.compiled[bound.grid](*tensors, *bound.trailing)


class Launcher:
    """The launches of one kernel, its compiled kernels kept per launch key."""

    def __init__(self, kernel: object, *, tensors: int, direct: bool | None = None) -> None:
        """``tensors``: how many of the kernel's leading parameters are tensors (the rest are
        scalars and constexprs). ``direct``: launch compiled kernels directly (default: when
        ``kernel`` is compiled, not interpreted)."""
        self.kernel = kernel
        self.tensors = tensors
        self.direct = isinstance(kernel, JITFunction) if direct is None else direct
        self.names = tuple(kernel.arg_names)
        self.compiled: dict[tuple, object] = {}
        self.bound: dict[tuple, BoundLaunch] = {}

    def __call__(
        self,
        grid: tuple[int, ...],
        arguments: tuple,
        constexprs: dict,
        *,
        num_warps: int,
        device: torch.device,
    ) -> object:
        """``kernel[grid](*arguments, **constexprs)`` with ``num_warps`` warps and FP contraction
        off, on ``device`` (made the current CUDA device for the launch when it is not).

        ``arguments`` are the kernel's leading parameters in order, ``constexprs`` the rest by
        name. Returns Triton's compiled kernel (None under the interpreter).
        """
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                return self.launch(grid, arguments, constexprs, num_warps, device)
        return self.launch(grid, arguments, constexprs, num_warps, device)

    def bind(
        self,
        key: tuple,
        grid: tuple[int, ...],
        arguments: tuple,
        constexprs: dict,
        *,
        num_warps: int,
        device: torch.device,
    ) -> BoundLaunch | None:
        """``__call__``, then, when it launched a compiled kernel directly or through the JIT
        launcher, that launch bound to ``key``: the wrapper's key (module docstring), which
        must determine ``grid``, ``arguments`` after the leading tensors, ``constexprs``,
        ``num_warps`` and ``device``. Returns the bound launch (None when nothing was bound:
        under the interpreter, or when the launcher is not ``direct``)."""
        compiled = self(grid, arguments, constexprs, num_warps=num_warps, device=device)
        if compiled is None or not self.direct:
            return None
        if len(self.bound) >= COMPILED_KERNELS:
            self.bound.clear()
        values = self.constexpr_values(arguments, constexprs)
        trailing = (*arguments[self.tensors :], *values)
        bound = self.bound[key] = BoundLaunch(compiled, grid, trailing, device.index)
        return bound

    def launch_bound(self, key: tuple, tensors: tuple) -> BoundLaunch | None:
        """Launch ``tensors`` (the leading arguments) with the launch bound to ``key``, on its
        device; returns that bound launch, or None where no launch is bound to ``key`` (then
        nothing was launched)."""
        bound = self.bound.get(key)
        if bound is not None:
            run_bound(bound, tensors)
        return bound

    def launch_keyed(
        self,
        key: tuple,
        tensors: tuple,
        build: Callable[[], tuple[tuple[int, ...], tuple, dict]],
        *,
        num_warps: int,
        device: torch.device,
    ) -> BoundLaunch | None:
        """Launch ``tensors`` with the launch bound to ``key``; on the key's first launch,
        ``build()`` gives (grid, arguments, constexprs) and ``bind`` binds them. Returns the bound
        launch that ran (None where none was bound, as ``bind``)."""
        bound = self.launch_bound(key, tensors)
        if bound is not None:
            return bound
        grid, arguments, constexprs = build()
        return self.bind(key, grid, arguments, constexprs, num_warps=num_warps, device=device)

    def launch(
        self,
        grid: tuple[int, ...],
        arguments: tuple,
        constexprs: dict,
        num_warps: int,
        device: torch.device,
    ) -> object:
        """The launch of ``__call__`` on the current device: through Triton's JIT launcher the
        first time a launch key is seen (or always, when not ``direct``), directly after."""
        if not self.direct:
            return self.jit_launch(grid, arguments, constexprs, num_warps)
        values = self.constexpr_values(arguments, constexprs)
        try:
            key = launch_key(arguments, self.tensors, values, num_warps, device)
        except AttributeError:  # a leading argument is no tensor: say which
            self.require_tensors_first(arguments)
            raise
        compiled = self.compiled.get(key)
        if compiled is None:
            self.require_tensors_first(arguments)
            compiled = self.jit_launch(grid, arguments, constexprs, num_warps)
            if compiled is not None:
                if len(self.compiled) >= COMPILED_KERNELS:
                    self.compiled.clear()
                self.compiled[key] = compiled
            return compiled
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*arguments, *values)
        return compiled

    def require_tensors_first(self, arguments: tuple) -> None:
        """The first ``tensors`` arguments are tensors and no other one is (the key's shape)."""
        kinds = [isinstance(value, Tensor) for value in arguments]
        if kinds != [True] * self.tensors + [False] * (len(arguments) - self.tensors):
            raise TypeError(
                f"{self.kernel} takes {self.tensors} leading tensor arguments, got tensors at "
                f"{[n for n, kind in enumerate(kinds) if kind]}"
            )

    def constexpr_values(self, arguments: tuple, constexprs: dict) -> tuple:
        """The constexprs in the order of the kernel's parameters after ``arguments``: with
        them, ``(*arguments, *values)`` is every parameter in order, as Triton's launcher binds
        them."""
        return tuple(map(constexprs.__getitem__, self.names[len(arguments) :]))

    def jit_launch(
        self, grid: tuple[int, ...], arguments: tuple, constexprs: dict, num_warps: int
    ) -> object:
        """The launch through Triton's JIT launcher."""
        return self.kernel[grid](
            *arguments,
            **constexprs,
            num_warps=num_warps,
            enable_fp_fusion=False,  # no FMA: every product is rounded before it is added
        )


def launch_key(
    arguments: tuple, tensors: int, constexprs: tuple, num_warps: int, device: torch.device
) -> tuple:
    """What selects the compiled kernel, a refinement of Triton's specialization (module
    docstring): the first ``tensors`` arguments are tensors, the others scalars."""
    return (
        device.index,
        num_warps,
        constexprs,
        arguments[tensors:],
        *[(value.dtype, value.data_ptr() & 15) for value in arguments[:tensors]],
    )
