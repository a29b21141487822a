"""The replay's forward with the goldens: every token one ``golden.conv_update`` and one
``golden.recurrent_step``, all sequences of a step in one batch.

Step ``t`` (plan.py) runs token ``t`` of every sequence longer than ``t`` through the two goldens
as one batch. The goldens are batch-invariant by construction (a row's bits depend on that row
alone: golden/__init__.py), so each token gets the bits of a decode step that held it alone:
the bits of the goldens applied token by token. The states live in scratch pools whose block 0
is the goldens' null block and whose block ``1 + r`` belongs to the sequence ranked ``r``; a
step's sequences are a prefix of the ranking, so each step hands the goldens the pools' first
``n + 1`` blocks. Runs on any device (the goldens' bits are the same on CPU and CUDA), one step
per token, each step a few dozen small tensor ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vllm_gdn_invariant import golden

from .checks import ReplayArgs, ReplayInputs
from .plan import with_null_block


def replay_with_goldens(inputs: ReplayInputs, checked: ReplayArgs) -> tuple[Tensor, Tensor, Tensor]:
    """(out [N, HV, V] in x's dtype, final conv state, final state), out of place."""
    x = inputs.x
    plan, dims = checked.plan, checked.dims
    device = x.device
    ranking = plan.ranking_on(device)
    conv_pool = with_null_block(inputs.conv_state.index_select(0, ranking))
    state_pool = with_null_block(inputs.state.index_select(0, ranking))
    starts = torch.tensor([plan.starts[s] for s in plan.ranking], dtype=torch.int64, device=device)
    out = torch.zeros((dims.batch, dims.num_v_heads, dims.head_v), dtype=x.dtype, device=device)
    blocks = torch.arange(1, plan.num_sequences + 1, dtype=torch.int32, device=device)
    for t, n in enumerate(plan.step_sizes):
        rows = starts[:n] + t
        y, new_conv = golden.conv_update(
            x.index_select(0, rows),
            conv_pool[: n + 1],
            inputs.conv_weight,
            blocks[:n],
            bias=inputs.conv_bias,
            activation=checked.activation,
            dim_first=True,
        )
        o, new_state = golden.recurrent_step(
            y,
            inputs.a.index_select(0, rows),
            inputs.b.index_select(0, rows),
            inputs.A_log,
            inputs.dt_bias,
            state_pool[: n + 1],
            blocks[:n],
            num_k_heads=dims.num_k_heads,
            scale=dims.scale,
            use_qk_l2norm=dims.use_qk_l2norm,
        )
        conv_pool[: n + 1] = new_conv
        state_pool[: n + 1] = new_state
        out[rows] = o[:, 0]
    unrank = torch.argsort(ranking)
    return out, conv_pool[1:].index_select(0, unrank), state_pool[1:].index_select(0, unrank)
