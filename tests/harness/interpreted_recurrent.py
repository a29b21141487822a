"""A recurrent-step case small enough for Triton's interpreter, and the bits a what-if kernel
writes for it against the golden's. Imported by the code that ``helpers.run_interpreted`` runs
(``TRITON_INTERPRET=1`` is set before this module imports Triton), never by a test module.

The case: one k-head, two value heads, K = 16, four batch rows of which rows 1 and 3 are
inactive by default (indices 0 and -1), V value rows; a kernel takes them in blocks of 8
rows, ``chunks`` per program, over one warp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.kernels import recurrent
from vllm_gdn_invariant.kernels.validation import RecurrentDims

H, HV, K, B = 1, 2, 16, 4
BLOCK_V = 8
PAST_OUT = 4 * BLOCK_V  # elements of sevens after the output


@dataclass(frozen=True)
class RecurrentCase:
    """The inputs of one step and the golden's output and new state."""

    inputs: tuple[torch.Tensor, ...]  # mixed_qkv, a, b, A_log, dt_bias
    state: torch.Tensor
    indices: torch.Tensor
    want_out: torch.Tensor
    want_state: torch.Tensor


def recurrent_case(
    generator: torch.Generator,
    state_dtype: torch.dtype,
    V: int,
    indices: tuple[int, ...] = (3, 0, 1, -1),  # rows 1 and 3 inactive
) -> RecurrentCase:
    """Random inputs drawn from ``generator`` and the golden's step on them, the rows' blocks
    ``indices``."""
    mixed = torch.randn(B, 2 * H * K + HV * V, generator=generator).bfloat16()
    a, b = (torch.randn(B, HV, generator=generator).bfloat16() for _ in range(2))
    A_log, dt_bias = torch.rand(HV, generator=generator), torch.randn(HV, generator=generator)
    state = (torch.randn(B + 2, HV, V, K, generator=generator) * 0.1).to(state_dtype)
    indices = torch.tensor(indices, dtype=torch.int32)
    want_out, want_state = golden.recurrent_step(
        mixed, a, b, A_log, dt_bias, state, indices, num_k_heads=H, scale=K**-0.5
    )
    return RecurrentCase((mixed, a, b, A_log, dt_bias), state, indices, want_out, want_state)


def bit_differences(
    case: RecurrentCase, chunks: int, launch: Callable[[tuple, tuple, dict], None]
) -> dict[str, int]:
    """``launch(grid, arguments, constexprs)`` (recurrent_step_kernel's, for blocks of 8 value
    rows, ``chunks`` per program) on a copy of the case's state and an output of sevens at the
    start of a longer buffer of sevens, and the elements whose bits differ from the golden's
    output and new state, from the old state (``state_changed``: the step did update it) and
    from the sevens past the output (``past_out_changed``: written outside it)."""
    mixed = case.inputs[0]
    V, state_dtype = case.state.shape[2], case.state.dtype
    bits = torch.int32 if state_dtype == torch.float32 else torch.int16
    dims = RecurrentDims(B, H, HV, K, V, K**-0.5, True)
    config = recurrent.RecurrentConfig(
        BLOCK_V, *recurrent.row_split(K, state_dtype), 1, chunks=chunks
    )
    new_state = case.state.clone()
    buffer = torch.full((B * HV * V + PAST_OUT,), 7.0, dtype=mixed.dtype)
    out = buffer[: B * HV * V].view(B, 1, HV, V)
    launch(*recurrent.kernel_arguments(*case.inputs, out, new_state, case.indices, dims, config))

    def differ(x: torch.Tensor, y: torch.Tensor, view: torch.dtype) -> int:
        return int((x.view(view) != y.view(view)).sum())

    past_out = buffer[B * HV * V :]
    return {
        "out_bits_differ": differ(out, case.want_out.reshape(out.shape), torch.int16),
        "state_bits_differ": differ(new_state, case.want_state, bits),
        "state_changed": differ(new_state, case.state, bits),
        "past_out_changed": differ(past_out, torch.full_like(past_out, 7.0), torch.int16),
    }
