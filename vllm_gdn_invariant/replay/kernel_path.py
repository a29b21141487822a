"""The replay's forward on CUDA: one launch of the golden-matched replay kernel.

``vllm_gdn_invariant.kernels.replay.replay_tokens`` runs every token of every sequence in one
launch, each token the goldens' ``conv_update`` then ``recurrent_step`` bit for bit, and
updates the states in place at ``conv_state[conv_indices[s]]`` and ``state[state_indices[s]]``.
Here the states are first copied into fresh pools after a null block (``plan.with_null_block``:
sequence ``s`` owns block ``s + 1``, since the goldens' contract treats index 0 as inactive),
so the caller's tensors are not touched, and the pools' blocks 1.. are returned. Nothing here
reads device memory on the host: ``cu_seqlens`` is handed to the kernel on x's device (a
host-to-device copy when the caller gave it on the CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import ReplayArgs, ReplayInputs
from .plan import with_null_block


def replay_with_kernel(
    inputs: ReplayInputs, cu_seqlens: Tensor, checked: ReplayArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """(out [N, HV, V] in x's dtype, final conv state, final state), out of place."""
    from vllm_gdn_invariant.kernels.replay import replay_tokens  # CUDA only; imports Triton

    x, dims = inputs.x, checked.dims
    conv_pool = with_null_block(inputs.conv_state)
    state_pool = with_null_block(inputs.state)
    blocks = torch.arange(1, conv_pool.shape[0], dtype=torch.int32, device=x.device)
    out = replay_tokens(
        x.contiguous(),
        inputs.a.contiguous(),
        inputs.b.contiguous(),
        inputs.A_log,
        inputs.dt_bias,
        inputs.conv_weight,
        inputs.conv_bias,
        conv_pool,
        blocks,
        state_pool,
        blocks,
        cu_seqlens.to(x.device, non_blocking=True),
        num_k_heads=dims.num_k_heads,
        scale=dims.scale,
        activation=checked.activation,
        use_qk_l2norm=dims.use_qk_l2norm,
        dim_first=True,
    )
    return out, conv_pool[1:], state_pool[1:]
