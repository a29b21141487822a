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

The launch key refines Triton's specialization: the device, ``num_warps``, every constexpr, each
tensor's dtype and data pointer modulo 16, and the exact value of every other argument. Two
launches with one key therefore have one specialization, and so one compiled kernel
(tests/kernels/test_kernels_launch.py checks the refinement against Triton's own specialization
function). Triton options read from the environment when a kernel is compiled (``TRITON_DEBUG``,
instrumentation) are those of the key's first launch. Under Triton's interpreter nothing is
compiled and every launch is the interpreter's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from triton.runtime import JITFunction

COMPILED_KERNELS = 1024  # launch keys kept per kernel; all are dropped beyond that


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
