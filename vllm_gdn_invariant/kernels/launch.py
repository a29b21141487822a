"""Launch of a kernel: FP contraction off, on the data's CUDA device."""

import contextlib

import torch
from triton.runtime import JITFunction


def launch(
    kernel: JITFunction,
    grid: tuple[int, ...],
    arguments: tuple,
    constexprs: dict,
    *,
    num_warps: int,
    device: torch.device,
) -> object:
    """``kernel[grid](*arguments, **constexprs)`` with ``num_warps`` warps and FP contraction off,
    under ``device``'s CUDA context when it is a CUDA device.

    Returns what the launch returned (Triton's compiled kernel; None under the interpreter).
    """
    context = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with context:
        return kernel[grid](
            *arguments,
            **constexprs,
            num_warps=num_warps,
            enable_fp_fusion=False,  # no FMA: every product is rounded before it is added
        )
