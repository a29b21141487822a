"""The autograd function of the replay: a bitwise forward, a recomputing backward.

``forward`` runs a given forward path (the goldens step by step, the replay kernel, or vLLM's
prefill kernels for a prompt) and returns its bits. ``backward`` recomputes the same function
in plain float32 PyTorch from the saved inputs (recurrence.py) and differentiates that with
``torch.autograd.grad``: the gradient is the float32 gradient of the replayed function, not the
gradient of its rounding. The backward is not itself differentiable (no double backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .checks import ReplayArgs, ReplayInputs
from .recurrence import replay_recurrence

Forward = Callable[[ReplayInputs], tuple[Tensor, Tensor, Tensor]]


class ReplayFunction(torch.autograd.Function):
    """apply(forward, args, x, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state, state)
    -> (out, conv_state, state); ``forward`` takes the nine tensors as ``ReplayInputs``
    (module docstring)."""

    @staticmethod
    def forward(
        ctx, forward: Forward, args: ReplayArgs, *inputs: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.args = args
        ctx.save_for_backward(*inputs)
        return forward(ReplayInputs(*inputs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        needs = ctx.needs_input_grad[2:]
        return (None, None, *recompute_grads(ctx.saved_tensors, needs, grads, ctx.args))


def recompute_grads(
    inputs: tuple[Tensor | None, ...],
    needs: tuple[bool, ...],
    grads: tuple[Tensor | None, ...],
    args: ReplayArgs,
) -> list[Tensor | None]:
    """Gradients of the inputs marked in ``needs`` given the outputs' ``grads`` (None: no
    gradient reaches that output), through recurrence.py's float32 recomputation."""
    wanted = [g is not None for g in grads]
    if not any(needs) or not any(wanted):
        return [None] * len(inputs)
    with torch.enable_grad():
        leaves = [
            None if t is None else t.detach().requires_grad_(need)
            for t, need in zip(inputs, needs, strict=True)
        ]
        outputs = replay_recurrence(ReplayInputs(*leaves), args, dtype=torch.float32)
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outputs, grads, strict=True) if g is not None]
        sources = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
        found = iter(
            torch.autograd.grad(
                [o for o, _ in pairs], sources, [g for _, g in pairs], allow_unused=True
            )
        )
    return [next(found) if need else None for need in needs]
