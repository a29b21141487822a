"""``prompt_state``: a prompt's GDN outputs and final states with the bits of vLLM's prefill.

Under ``VLLM_BATCH_INVARIANT=1`` with this plugin, a Qwen GDN layer prefills with FLA's chunk
kernels (``patches/bi_prefill.py``), every non-final prefill chunk ends on their 64-token grid
(``patches/bi_chunk_grid.py``) and the recurrent state is float32 (``patches/bi_ssm_state.py``),
so a prompt's bits do not depend on how the scheduler split it: they are those of the whole
prompt in one prefill. That prefill is what this module runs, with the functions the installed
vLLM's ``QwenGatedDeltaNetAttention._forward_core`` calls on its prefill path
(``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``, the same sequence in every
supported release, 0.26.0 to 0.34.0), taken from that module's namespace:

1. ``causal_conv1d_fn`` on x transposed (channel-last), conv states in vLLM's layout
   (``is_conv_state_dim_first``), ``has_initial_state`` False for a fresh prompt, writing each
   sequence's final conv state (its last W-1 inputs, in the conv state's dtype) to its block;
2. ``fused_post_conv_prep`` (q, k l2-normalized; g and beta in float32);
3. ``fla_chunk_gated_delta_rule`` (FLA's ``chunk_gated_delta_rule``, which
   ``ChunkGatedDeltaRule.forward_native`` calls and which the plugin's batch-invariant mode
   selects) with ``use_qk_l2norm_in_kernel=False``, the default scale K^-0.5, float32 initial
   states (zero for a fresh prompt) and the chunk tables of ``prepare_chunk_indices`` /
   ``prepare_chunk_offsets`` on the host's ``cu_seqlens``, as vLLM's metadata builder computes
   them.

These are Triton kernels, run on CUDA tensors only. (Under Triton's interpreter on the CPU,
with Triton handed to vLLM's CPU build as ``scripts/prefill_interpreter_check.py`` does, this
sequence gave outputs of magnitude 1e8 from inputs of magnitude 1 on a 75-token case whose conv
tail was exact, from the first token on; not investigated further.) The result is
differentiable the way ``replay_response``'s is: the backward recomputes the same function in
float32 PyTorch (recurrence.py; vLLM's prefill is that function, computed in chunks).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .checks import ReplayArgs, ReplayInputs, check_prompt_args
from .function import ReplayFunction
from .plan import with_null_block

PREFILL_DTYPES = (torch.bfloat16, torch.float16)  # FLA's chunk kernels refuse float32 q, k, v


def require_prefill_device(x: Tensor) -> None:
    """vLLM's prefill kernels run on CUDA."""
    if x.device.type != "cuda":
        raise ValueError(
            f"x is on {x.device}; prompt_state runs vLLM's Triton prefill kernels, on CUDA only"
        )


def prefill_with_vllm(
    inputs: ReplayInputs, *, checked: ReplayArgs, fresh: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """(out [N, HV, V] in x's dtype, final conv state, final float32 state) from vLLM's prefill
    functions (module docstring); the inputs are not modified."""
    # vLLM's layer code is imported when a prompt first runs: importing the replay package
    # (a trainer's CPU process included) does not load vLLM's model executor.
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen
    from vllm.third_party.flash_linear_attention.ops.index import (
        prepare_chunk_indices,
        prepare_chunk_offsets,
    )

    x, conv_state = inputs.x, inputs.conv_state
    dims, device = checked.dims, x.device
    sequences = conv_state.shape[0]
    if qwen.is_conv_state_dim_first():
        conv_pool = with_null_block(conv_state)
    else:  # vLLM stores [blocks, W-1, dim] and hands the kernels its transpose
        conv_pool = with_null_block(conv_state.transpose(1, 2).contiguous()).transpose(1, 2)
    blocks = torch.arange(1, sequences + 1, dtype=torch.int32, device=device)
    starts = torch.tensor(checked.plan.starts + (checked.plan.num_tokens,), dtype=torch.int32)
    query_start_loc = starts.to(device)
    has_initial_state = torch.full((sequences,), not fresh, dtype=torch.bool, device=device)

    conv_out = qwen.causal_conv1d_fn(
        x.contiguous().transpose(0, 1),
        inputs.conv_weight,
        inputs.conv_bias,
        activation=checked.activation,
        conv_states=conv_pool,
        has_initial_state=has_initial_state,
        cache_indices=blocks,
        query_start_loc=query_start_loc,
        metadata=None,
    ).transpose(0, 1)
    q, k, v, g, beta = qwen.fused_post_conv_prep(
        conv_output=conv_out,
        a=inputs.a.contiguous(),
        b=inputs.b.contiguous(),
        A_log=inputs.A_log,
        dt_bias=inputs.dt_bias,
        num_k_heads=dims.num_k_heads,
        head_k_dim=dims.head_k,
        head_v_dim=dims.head_v,
        apply_l2norm=True,
        output_g_exp=False,
    )
    out, final_state = qwen.fla_chunk_gated_delta_rule(
        q=q.unsqueeze(0),
        k=k.unsqueeze(0),
        v=v.unsqueeze(0),
        g=g.unsqueeze(0),
        beta=beta.unsqueeze(0),
        initial_state=inputs.state.to(torch.float32).clone(),
        output_final_state=True,
        cu_seqlens=query_start_loc,
        chunk_indices=prepare_chunk_indices(starts, qwen.FLA_CHUNK_SIZE).to(device),
        chunk_offsets=prepare_chunk_offsets(starts, qwen.FLA_CHUNK_SIZE).to(device),
        use_qk_l2norm_in_kernel=False,
    )
    return (
        out.squeeze(0).to(x.dtype),
        conv_pool[1:].contiguous(),
        final_state.to(torch.float32),
    )


def prompt_state(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    conv_weight: Tensor,
    cu_seqlens: Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    conv_bias: Tensor | None = None,
    activation: str | None = "silu",
    conv_state: Tensor | None = None,
    state: Tensor | None = None,
    conv_state_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every prompt token's GDN output and each prompt's final states, with the bits of vLLM's
    batch-invariant prefill (module docstring).

    Arguments as ``replay_response``'s (x [N, 2*H*K + HV*V] in bfloat16 or float16, prompts
    packed back to back by ``cu_seqlens``), with the head dims given: ``head_k_dim`` K,
    ``head_v_dim`` V. ``conv_state`` [S, dim, W-1] and ``state`` [S, HV, V, K] (float32) are the
    states a prompt continues from (a prefix-cache hit), both or neither: without them each
    prompt starts fresh, as vLLM's ``has_initial_state`` False, with a zero conv history in
    ``conv_state_dtype`` (default x's dtype: vLLM's conv cache has the model's dtype).

    Returns ``out`` [N, HV, V] in x's dtype, the final conv state [S, dim, W-1] and the final
    state [S, HV, V, K] in float32: what ``replay_response`` takes for the response that follows.
    No argument is modified. Differentiable like ``replay_response``.
    """
    checked, conv_state0, state0 = check_prompt_args(
        x,
        a,
        b,
        A_log,
        dt_bias,
        conv_weight,
        cu_seqlens,
        num_k_heads=num_k_heads,
        head_k_dim=head_k_dim,
        head_v_dim=head_v_dim,
        conv_bias=conv_bias,
        activation=activation,
        conv_state=conv_state,
        state=state,
        conv_state_dtype=conv_state_dtype,
    )
    if x.dtype not in PREFILL_DTYPES:
        raise TypeError(f"x must be bfloat16 or float16 for vLLM's chunk kernels, got {x.dtype}")
    require_prefill_device(x)
    forward = functools.partial(prefill_with_vllm, checked=checked, fresh=conv_state is None)
    inputs = ReplayInputs(x, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state0, state0)
    return ReplayFunction.apply(forward, checked, *inputs)
