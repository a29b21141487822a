"""CPU stand-ins for vLLM's GDN Triton kernels, with vLLM's call signatures.

The decode-only pair (``causal_conv1d_update``, ``fused_recurrent_gated_delta_rule_packed_decode``)
are the goldens applied in place. ``fused_sigmoid_gating_delta_rule_update`` (what upstream's
mixed step runs for decode rows) computes the same recurrence in float64 and rounds once, so
its bits differ from the golden's, as the two real kernels' do. The prefill stand-ins
(``causal_conv1d_fn``, ``fused_post_conv_prep``, the chunk rule) work one sequence at a time;
``causal_conv1d_fn`` also checks that the conv program tables it is given describe exactly the
sequences of ``query_start_loc``.
"""

from __future__ import annotations

import math

import torch

from vllm_gdn_invariant.golden import conv_update, recurrent_step, sigmoid, softplus
from vllm_gdn_invariant.golden import exp as golden_exp

PAD_SLOT_ID = -1
CONV_BLOCK_M = 8
KERNELS = (  # what the stand-ins replace in vLLM's qwen_gdn_linear_attn (tests/conftest.py)
    "causal_conv1d_update",
    "causal_conv1d_fn",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "fused_sigmoid_gating_delta_rule_update",
    "fused_post_conv_prep",
)
KERNELS_SINCE_0_34 = ("gather_initial_states", "scatter_states")


def l2_normalize(x):
    """x / sqrt(sum(x * x) + 1e-6) over the last dimension, in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def write_blocks(cache: torch.Tensor, new: torch.Tensor, indices: torch.Tensor) -> None:
    active = indices[indices > 0].long()
    cache[active] = new[active]


def causal_conv1d_update(
    x,
    conv_state,
    weight,
    bias=None,
    activation=None,
    conv_state_indices=None,
    validate_data=False,
    **unused,
):
    assert not unused.get("num_accepted_tokens"), "spec decode does not reach the stand-in"
    indices = conv_state_indices.to(torch.int64)
    out, new = conv_update(x, conv_state, weight, indices, bias=bias, activation=activation)
    write_blocks(conv_state, new, indices)
    return out


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    out,
    ssm_state_indices,
    use_qk_l2norm_in_kernel=True,
):
    num_v_heads, head_v_dim, head_k_dim = initial_state.shape[1:]
    num_k_heads = (mixed_qkv.shape[1] - num_v_heads * head_v_dim) // (2 * head_k_dim)
    indices = ssm_state_indices.to(torch.int64)
    o, new = recurrent_step(
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        initial_state,
        indices,
        num_k_heads=num_k_heads,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
    )
    out.copy_(o)
    write_blocks(initial_state, new, indices)
    return out, initial_state


def float64_recurrence(q, k, v, g, beta, h):
    """One token, float64: q, k [H, K]; v [HV, V]; g, beta [HV]; h [HV, V, K] (updated)."""
    group = v.shape[0] // q.shape[0]
    q = q.repeat_interleave(group, 0)
    k = k.repeat_interleave(group, 0)
    h.mul_(torch.exp(g)[:, None, None])
    delta = (v - torch.einsum("hvk,hk->hv", h, k)) * beta[:, None]
    h.add_(delta[:, :, None] * k[:, None, :])
    return torch.einsum("hvk,hk->hv", h, q)


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    initial_state,
    inplace_final_state,
    cu_seqlens,
    ssm_state_indices,
    use_qk_l2norm_in_kernel=True,
    num_accepted_tokens=None,
    **unused,
):
    assert num_accepted_tokens is None and inplace_final_state
    scale = q.shape[-1] ** -0.5
    out = torch.zeros(1, q.shape[1], v.shape[2], v.shape[3], dtype=q.dtype)
    starts = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        block = int(ssm_state_indices[seq])
        if block <= 0:
            continue
        h = initial_state[block].double()
        for t in range(start, end):
            qt, kt = q[0, t].double(), k[0, t].double()
            if use_qk_l2norm_in_kernel:
                qt, kt = l2_normalize(qt), l2_normalize(kt)
            x = a[t].double() + dt_bias.double()
            g = -torch.exp(A_log.double()) * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
            beta = torch.sigmoid(b[t].double())
            out[0, t] = float64_recurrence(qt * scale, kt, v[0, t].double(), g, beta, h).to(
                out.dtype
            )
        initial_state[block] = h.to(initial_state.dtype)
    return out, initial_state


def check_conv_programs(metadata, query_start_loc) -> None:
    """The causal_conv1d_fn program tables must describe exactly these sequences."""
    lens = query_start_loc.diff().tolist()
    nums = [math.ceil(n / CONV_BLOCK_M) for n in lens]
    mlist = [s for s, n in enumerate(nums) for _ in range(n)]
    offsets = [i for n in nums for i in range(n)]
    entry = metadata.nums_dict[CONV_BLOCK_M]
    assert entry["tot"] == sum(nums) == entry["mlist_len"]
    assert entry["nums"].tolist() == nums
    assert entry["mlist"].tolist() == mlist
    assert entry["offsetlist"].tolist() == offsets
    ptr = entry["batch_ptr"] if entry.get("batch_ptr") is not None else metadata.batch_ptr
    chunk = entry.get("token_chunk_offset_ptr")
    chunk = metadata.token_chunk_offset_ptr if chunk is None else chunk
    assert ptr[: len(mlist)].tolist() == mlist
    assert chunk[: len(offsets)].tolist() == offsets


def causal_conv1d_fn(
    x,
    weight,
    bias,
    activation,
    conv_states,
    has_initial_state,
    cache_indices,
    query_start_loc,
    metadata=None,
    **unused,
):
    check_conv_programs(metadata, query_start_loc)
    tokens = x.transpose(0, 1)  # [T, dim]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    scratch = torch.zeros(2, *conv_states.shape[1:], dtype=conv_states.dtype)
    one = torch.ones(1, dtype=torch.int64)
    for seq, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        block = int(cache_indices[seq])
        if block == PAD_SLOT_ID:
            continue
        scratch[1] = conv_states[block] if bool(has_initial_state[seq]) else 0
        for t in range(start, end):
            y, new = conv_update(
                tokens[t : t + 1], scratch, weight, one, bias=bias, activation=activation
            )
            out[:, t] = y[0]
            scratch = new
        conv_states[block] = scratch[1]
    return out


def fused_post_conv_prep(
    conv_output,
    a,
    b,
    A_log,
    dt_bias,
    num_k_heads,
    head_k_dim,
    head_v_dim,
    apply_l2norm=True,
    output_g_exp=False,
):
    length = conv_output.shape[0]
    key_dim = num_k_heads * head_k_dim
    x = conv_output.float()
    q = x[:, :key_dim].reshape(length, num_k_heads, head_k_dim)
    k = x[:, key_dim : 2 * key_dim].reshape(length, num_k_heads, head_k_dim)
    v = x[:, 2 * key_dim :].reshape(length, -1, head_v_dim)
    if apply_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    g = -golden_exp(A_log.float()) * softplus(a.float() + dt_bias.float())
    if output_g_exp:  # FlashInfer takes the decay itself
        g = golden_exp(g)
    beta = sigmoid(b.float())
    return (q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), g, beta)


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state,
    output_final_state,
    cu_seqlens,
    use_qk_l2norm_in_kernel=False,
    **unused,
):
    assert output_final_state and not use_qk_l2norm_in_kernel
    scale = q.shape[-1] ** -0.5
    out = torch.zeros(1, q.shape[1], v.shape[2], v.shape[3], dtype=q.dtype)
    final = initial_state.clone().float()
    starts = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        h = final[seq].double()
        for t in range(start, end):
            out[0, t] = float64_recurrence(
                q[0, t].double() * scale,
                k[0, t].double(),
                v[0, t].double(),
                g[0, t].double(),
                beta[0, t].double(),
                h,
            ).to(out.dtype)
        final[seq] = h.float()
    return out, final


def gather_initial_states(state, indices, has_initial_state):
    """vLLM 0.34's gather: the rows of ``indices``, zero where there is no initial state."""
    rows = state[indices.long()].clone()
    rows[~has_initial_state.bool()] = 0
    return rows


def scatter_states(state, new_states, indices):
    """vLLM 0.34's scatter: ``state[indices] = new_states`` in the cache dtype."""
    state[indices.long()] = new_states.to(state.dtype)


def flashinfer_chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    initial_state,
    output_final_state,
    cu_seqlens,
    output=None,
    state_checkpoints=None,
    checkpoint_cu_starts=None,
    checkpoint_every_n_tokens=0,
    use_cp="auto",
    backend="flashinfer",
    scale=None,
    **unused,
):
    """FlashInfer's ``gdn_prefill.chunk_gated_delta_rule``: q, k [T, H, K], v [T, HV, V], the
    decay ``g`` already exponentiated, fp32 states [N, HV, V, K]; sequence ``i`` writes its
    state after every ``checkpoint_every_n_tokens`` tokens to
    ``state_checkpoints[checkpoint_cu_starts[i] + j]``."""
    assert output_final_state
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape[0], v.shape[1], v.shape[2], dtype=q.dtype)
    final = initial_state.clone().float()
    starts = cu_seqlens.tolist()
    for seq, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        h = final[seq].double()
        for t in range(start, end):
            group = v.shape[1] // q.shape[1]
            qt = q[t].double().repeat_interleave(group, 0) * scale
            kt = k[t].double().repeat_interleave(group, 0)
            h.mul_(g[t].double()[:, None, None])
            delta = (v[t].double() - torch.einsum("hvk,hk->hv", h, kt)) * beta[t].double()[:, None]
            h.add_(delta[:, :, None] * kt[:, None, :])
            out[t] = torch.einsum("hvk,hk->hv", h, qt).to(out.dtype)
            done = t + 1 - start
            if checkpoint_every_n_tokens and done % checkpoint_every_n_tokens == 0:
                slot = int(checkpoint_cu_starts[seq]) + done // checkpoint_every_n_tokens - 1
                if slot < int(checkpoint_cu_starts[seq + 1]):
                    state_checkpoints[slot] = h.float()
        final[seq] = h.float()
    if output is not None:
        output.copy_(out)
        out = output
    return out, final


class StoreCacheCheckpointsKernel:
    """vLLM's ``store_cache_checkpoints_kernel[grid](...)``, one program per checkpoint row:
    the row's conv window (the ``STATE_LEN`` raw inputs before its checkpoint offset) and its
    recurrent state (row ``recurrent_rows[i]`` of the emitted checkpoints) go to its block."""

    def __getitem__(self, grid):
        return self.launch

    @staticmethod
    def launch(
        x,
        conv_state,
        recurrent_checkpoint,
        recurrent_state,
        query_start_loc,
        checkpoint_offsets,
        state_indices,
        recurrent_rows,
        token_indices,
        x_stride_0,
        x_stride_1,
        state_stride_0,
        state_stride_1,
        state_stride_2,
        checkpoint_stride_0,
        recurrent_state_stride_0,
        checkpoint_offset_stride,
        state_len,
        width,
        recurrent_row_size,
        null_state_idx,
        has_recurrent,
        has_recurrent_rows,
        has_token_map,
        block_size,
    ):
        assert not has_token_map
        for row in range(checkpoint_offsets.numel()):
            block = int(state_indices[row])
            offset = int(checkpoint_offsets[row])
            if block == null_state_idx or offset <= 0:
                continue
            if offset >= state_len:
                end = int(query_start_loc[row]) + offset
                conv_state[block] = x[end - state_len : end].transpose(0, 1)
            if has_recurrent:
                source = int(recurrent_rows[row]) if has_recurrent_rows else row
                recurrent_state[block] = (
                    recurrent_checkpoint[source]
                    .reshape(recurrent_state[block].shape)
                    .to(recurrent_state.dtype)
                )
