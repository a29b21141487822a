"""The replacements of mode ``golden`` (patch note: ``golden_decode.py``)."""

from __future__ import annotations

import importlib

import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.kernels.replay import replay_tokens
from vllm_gdn_invariant.kernels.serving import decode_step
from vllm_gdn_invariant.patches.routed_forward_core import gdn_invariant_split_mixed_step

CPU_GDN_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def conv_weight_2d(layer) -> torch.Tensor:
    """The layer's conv weight as [dim, W] (vLLM stores [dim, 1, W])."""
    weight = layer.conv1d.weight
    return weight.view(weight.size(0), weight.size(2))


def golden_forward_core_decode_non_spec(
    self,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
    attn_metadata,
):
    """Non-spec decode rows through the golden-matched kernels (vllm-gdn-invariant, mode
    golden): bitwise ``golden.conv_update`` then ``golden.recurrent_step``, the output written
    into ``core_attn_out`` by the recurrent kernel, as vLLM's packed decode writes it (or
    copied there, where ``core_attn_out`` is not contiguous or not of mixed_qkv's dtype)."""
    num_actual_tokens = attn_metadata.num_actual_tokens
    state_indices = attn_metadata.non_spec_state_indices_tensor[:num_actual_tokens]
    target = core_attn_out[:num_actual_tokens].unsqueeze(1)
    writable = target.is_contiguous() and target.dtype == mixed_qkv.dtype
    out = decode_step(
        mixed_qkv[:num_actual_tokens],
        a[:num_actual_tokens],
        b[:num_actual_tokens],
        self.A_log,
        self.dt_bias,
        self.kv_cache[0],
        conv_weight_2d(self),
        self.conv1d.bias,
        self.kv_cache[1],
        state_indices,
        num_k_heads=self.num_k_heads // self.tp_size,
        scale=self.head_k_dim**-0.5,
        activation=self.activation,
        dim_first=is_conv_state_dim_first(),
        out=target if writable else None,
    )
    if not writable:
        target.copy_(out)


def golden_replay_tokens(
    layer,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Every token of packed rows (row ``s``'s at ``cu_seqlens[s]:cu_seqlens[s + 1]``) as mode
    golden's decode steps, token after token, in one call of the replay kernels
    (``kernels/replay.py``): ``out`` receives the outputs, the rows' conv and recurrent blocks
    (``state_indices``) end in the states after their last token; bitwise
    :func:`golden_forward_core_decode_non_spec` applied to one token of every row at a time."""
    replay_tokens(
        mixed_qkv,
        a,
        b,
        layer.A_log,
        layer.dt_bias,
        conv_weight_2d(layer),
        layer.conv1d.bias,
        layer.kv_cache[0],
        state_indices,
        layer.kv_cache[1],
        state_indices,
        cu_seqlens,
        num_k_heads=layer.num_k_heads // layer.tp_size,
        scale=layer.head_k_dim**-0.5,
        activation=layer.activation,
        dim_first=is_conv_state_dim_first(),
        out=out,
    )


def compact_blocks(cache: torch.Tensor, indices: torch.Tensor):
    """The active rows' blocks as a small cache (block 0 unused) and the rows' indices into it.

    The goldens return a whole new state; on vLLM's cache (all of its blocks) that copy would
    dominate the step. Their bits do not depend on the blocks no row reads.
    """
    active = indices > 0
    blocks = indices[active]
    local = torch.zeros_like(indices)
    local[active] = torch.arange(1, blocks.numel() + 1, dtype=indices.dtype)
    small = torch.cat([torch.zeros_like(cache[:1]), cache[blocks]])
    return small, local, blocks


def golden_cpu_decode(layer, mixed_qkv, b, a, state_indices, core_attn_out) -> None:
    """Decode rows on vLLM's CPU build through the PyTorch goldens.

    vLLM's CPU kernels read each recurrent state block as [HV, K, V] (``ssm_state.view(...,
    k_dim, v_dim)``); the goldens take [HV, V, K], so they get that memory transposed and the
    blocks they write are read back by vLLM's CPU prefill the same way.
    """
    cpu_gdn = importlib.import_module(CPU_GDN_MODULE)
    conv_cache = layer.kv_cache[0]
    ssm = layer.kv_cache[1]
    slots, heads, v_dim, k_dim = ssm.shape
    state_cache = ssm.view(slots, heads, k_dim, v_dim).transpose(-1, -2)
    indices = state_indices.to(torch.int64)
    conv_state, local, blocks = compact_blocks(conv_cache, indices)
    state, _, _ = compact_blocks(state_cache, indices)
    conv_out, new_conv = conv_update(
        mixed_qkv,
        conv_state,
        cpu_gdn._unpacked_conv_weight(layer),  # vLLM's CPU build may pack the weight
        local,
        bias=layer.conv1d.bias,
        activation=layer.activation,
        dim_first=is_conv_state_dim_first(),
    )
    out, new_state = recurrent_step(
        conv_out,
        a,
        b,
        layer.A_log,
        layer.dt_bias,
        state,
        local,
        num_k_heads=layer.num_k_heads // layer.tp_size,
        scale=layer.head_k_dim**-0.5,
    )
    conv_cache[blocks] = new_conv[1:]
    state_cache[blocks] = new_state[1:]
    core_attn_out[: out.shape[0]] = out.squeeze(1)


def golden_cpu_gdn_attention_nonspec(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out):
    """vLLM's CPU GDN core with decode rows through the goldens (vllm-gdn-invariant, mode
    golden); prefill rows through vLLM's function on a prefill-only view of the step."""
    upstream = importlib.import_module(CPU_GDN_MODULE)._cpu_gdn_attention_nonspec_upstream
    num_decodes = attn_metadata_i.num_decodes
    num_decode_tokens = attn_metadata_i.num_decode_tokens
    if num_decodes == 0 or num_decode_tokens != num_decodes:
        return upstream(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out)
    golden_cpu_decode(
        layer,
        mixed_qkv[:num_decode_tokens].contiguous(),
        b[:num_decode_tokens].contiguous(),
        a[:num_decode_tokens].contiguous(),
        attn_metadata_i.non_spec_state_indices_tensor[:num_decodes],
        core_attn_out,
    )
    if attn_metadata_i.num_prefills == 0:
        return None
    _, prefill_metadata = gdn_invariant_split_mixed_step(attn_metadata_i)
    end = num_decode_tokens + attn_metadata_i.num_prefill_tokens
    return upstream(
        layer,
        prefill_metadata,
        mixed_qkv[num_decode_tokens:end],
        b[num_decode_tokens:end],
        a[num_decode_tokens:end],
        core_attn_out[num_decode_tokens:end],
    )
