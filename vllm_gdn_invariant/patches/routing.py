"""Route the decode rows of mixed decode+prefill steps through vLLM's decode-only kernels.

In a non-speculative step that holds both decode rows and prefills, vLLM's ``_forward_core``
runs the decode rows through ``causal_conv1d_fn`` and ``fused_sigmoid_gating_delta_rule_update``;
in a decode-only step the same rows go through ``causal_conv1d_update`` and
``fused_recurrent_gated_delta_rule_packed_decode``. The two recurrent kernels round
differently, so a decode row's bits depend on whether a prefill shared its step.

The replacement splits a mixed step at ``num_decode_tokens`` (the builder puts decodes first):

* the decode rows run ``_forward_core_decode_non_spec``, vLLM's own decode-only path, with
  a view of the metadata that describes a decode-only step of those rows;
* the prefill rows run vLLM's own ``_forward_core`` (kept as ``_forward_core_upstream``) on
  the prefill tail, with a view that describes a prefill-only step: the builder's prefill
  metadata (``prefill_*``, chunk indices) is already rebased to the tail; the non-spec
  indices, query starts and causal-conv1d program tables are rebased here, once per step.

Every other step (speculative, decode-only, prefill-only, profile runs) goes to
``_forward_core_upstream`` unchanged, and so do mixed steps when the packed decode path is
switched off (``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0``) or when the step exports FlashInfer
prefill checkpoints (0.33+ with ``mamba_cache_mode=align``), whose row tables index the whole
batch; the latter is logged once.

The functions below are written so that ``scripts/make_patches.py`` can copy their source
into vLLM's module: they use only names that module has or that the patch imports.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from vllm.forward_context import get_forward_context

GDN_INVARIANT_SPLIT_ATTR = "gdn_invariant_split"
GDN_INVARIANT_PAD_SLOT_ID = -1
GDN_INVARIANT_WARNED: list[bool] = []

logger = logging.getLogger("vllm_gdn_invariant.routing")


def gdn_invariant_drop_programs(batch_ptr, num_decodes):
    """causal_conv1d_fn's per-program sequence table without the first ``num_decodes`` rows."""
    tail = batch_ptr[num_decodes:]
    return torch.where(tail == GDN_INVARIANT_PAD_SLOT_ID, tail, tail - num_decodes)


def gdn_invariant_rebase_conv_programs(nums_dict, batch_ptr, token_chunk_offset_ptr, num_decodes):
    """Drop the first ``num_decodes`` one-token sequences from causal_conv1d_fn's tables."""
    if nums_dict is None:
        return None, None, None
    rebased = {}
    for block_m, entry in nums_dict.items():
        rebased[block_m] = {
            **entry,
            "nums": entry["nums"][num_decodes:],
            "tot": entry["tot"] - num_decodes,
            "mlist": entry["mlist"][num_decodes:] - num_decodes,
            "mlist_len": entry["mlist_len"] - num_decodes,
            "offsetlist": entry["offsetlist"][num_decodes:],
        }
        if entry.get("batch_ptr") is not None:
            rebased[block_m]["batch_ptr"] = gdn_invariant_drop_programs(
                entry["batch_ptr"], num_decodes
            )
            rebased[block_m]["token_chunk_offset_ptr"] = entry["token_chunk_offset_ptr"][
                num_decodes:
            ]
    if batch_ptr is not None:
        batch_ptr = gdn_invariant_drop_programs(batch_ptr, num_decodes)
    if token_chunk_offset_ptr is not None:
        token_chunk_offset_ptr = token_chunk_offset_ptr[num_decodes:]
    return rebased, batch_ptr, token_chunk_offset_ptr


def gdn_invariant_split_mixed_step(attn_metadata):
    """The (decode-only, prefill-only) metadata views of a mixed step, built once per step."""
    split = getattr(attn_metadata, GDN_INVARIANT_SPLIT_ATTR, None)
    if split is not None:
        return split
    num_decodes = attn_metadata.num_decodes
    num_decode_tokens = attn_metadata.num_decode_tokens
    state_indices = attn_metadata.non_spec_state_indices_tensor
    has_initial_state = attn_metadata.has_initial_state
    decode = dataclasses.replace(
        attn_metadata,
        num_prefills=0,
        num_prefill_tokens=0,
        num_actual_tokens=num_decode_tokens,
        has_initial_state=None,
        non_spec_query_start_loc=attn_metadata.non_spec_query_start_loc[: num_decodes + 1],
        non_spec_state_indices_tensor=state_indices[:num_decodes],
        chunk_indices=None,
        chunk_offsets=None,
        prefill_query_start_loc=None,
        prefill_state_indices=None,
        prefill_has_initial_state=None,
        nums_dict=None,
        batch_ptr=None,
        token_chunk_offset_ptr=None,
    )
    nums_dict, batch_ptr, token_chunk_offset_ptr = gdn_invariant_rebase_conv_programs(
        attn_metadata.nums_dict,
        attn_metadata.batch_ptr,
        attn_metadata.token_chunk_offset_ptr,
        num_decodes,
    )
    prefill = dataclasses.replace(
        attn_metadata,
        num_decodes=0,
        num_decode_tokens=0,
        num_actual_tokens=attn_metadata.num_actual_tokens - num_decode_tokens,
        has_initial_state=None if has_initial_state is None else has_initial_state[num_decodes:],
        non_spec_query_start_loc=attn_metadata.prefill_query_start_loc,
        non_spec_state_indices_tensor=state_indices[num_decodes:],
        nums_dict=nums_dict,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=token_chunk_offset_ptr,
    )
    split = (decode, prefill)
    setattr(attn_metadata, GDN_INVARIANT_SPLIT_ATTR, split)
    return split


def gdn_invariant_routes(layer, attn_metadata):
    """Whether this step's decode rows take the decode-only path (a mixed non-spec step)."""
    if (
        attn_metadata is None
        or not layer.enable_packed_recurrent_decode
        or attn_metadata.spec_sequence_masks is not None
        or attn_metadata.num_prefills == 0
        or attn_metadata.num_decodes == 0
    ):
        return False
    if getattr(attn_metadata, "flashinfer_checkpoint_plan", None) is not None:
        if not GDN_INVARIANT_WARNED:
            GDN_INVARIANT_WARNED.append(True)
            logger.warning(
                "gdn_invariant: a mixed step exports FlashInfer prefill checkpoints; "
                "such steps are left to vLLM and their decode rows are not routed"
            )
        return False
    return True


def routed_forward_core(
    self,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
):
    """Mixed non-spec steps: decode rows take the decode-only path (vllm-gdn-invariant)."""
    forward_context = get_forward_context()
    layer_metadata = forward_context.attn_metadata
    attn_metadata = None
    if isinstance(layer_metadata, dict):
        attn_metadata = layer_metadata.get(self.prefix)
    if not gdn_invariant_routes(self, attn_metadata):
        return self._forward_core_upstream(
            mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out
        )
    decode_metadata, prefill_metadata = gdn_invariant_split_mixed_step(attn_metadata)
    num_decode_tokens = attn_metadata.num_decode_tokens
    num_actual_tokens = attn_metadata.num_actual_tokens
    self._forward_core_decode_non_spec(
        mixed_qkv=mixed_qkv[:num_decode_tokens],
        b=b[:num_decode_tokens],
        a=a[:num_decode_tokens],
        core_attn_out=core_attn_out[:num_decode_tokens],
        attn_metadata=decode_metadata,
    )
    layer_metadata[self.prefix] = prefill_metadata
    try:
        self._forward_core_upstream(
            mixed_qkv=mixed_qkv[num_decode_tokens:num_actual_tokens],
            b=b[num_decode_tokens:num_actual_tokens],
            a=a[num_decode_tokens:num_actual_tokens],
            core_attn_out=core_attn_out[num_decode_tokens:num_actual_tokens],
        )
    finally:
        layer_metadata[self.prefix] = attn_metadata
