"""The replacement ``_forward_core``: a mixed step's decode rows take the decode-only path.

In a non-speculative step that holds both decode rows and prefills, vLLM's ``_forward_core``
runs the decode rows through ``causal_conv1d_fn`` and ``fused_sigmoid_gating_delta_rule_update``;
in a decode-only step the same rows go through ``causal_conv1d_update`` and
``fused_recurrent_gated_delta_rule_packed_decode``. The two recurrent kernels round
differently, so a decode row's bits depend on whether a prefill shared its step.

:func:`routed_forward_core` splits a mixed step at ``num_decode_tokens`` (the builder puts
decodes first):

* the decode rows run ``_forward_core_decode_non_spec``, vLLM's own decode-only path, with
  a view of the metadata that describes a decode-only step of those rows;
* the prefill rows run vLLM's own ``_forward_core`` (kept as ``_forward_core_upstream``) on
  the prefill tail, with a view that describes a prefill-only step of the tail. The builder's
  prefill fields (``prefill_*``, chunk indices) already describe the tail; the non-spec
  indices, query starts, causal-conv1d program tables and, where present, the prefill
  checkpoint rows and FlashInfer's checkpoint plan are rebased here, once per step and
  metadata object, and kept in a cache keyed by a weak reference to that object.

Every other step goes to ``_forward_core_upstream`` unchanged: speculative steps, decode-only
and prefill-only steps, profile runs, steps whose decode rows carry more than one token, and
every step when vLLM's packed decode is switched off
(``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0``: then vLLM runs decode rows through one kernel
in every step).

The module-level names below starting with ``gdn_invariant`` and :func:`routed_forward_core`
are copied verbatim into vLLM's module by ``scripts/make_patches.py`` (``vllm-diffs/`` at the
repository root), so they use only names that module has or that the patch imports.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
from vllm.forward_context import get_forward_context

GDN_INVARIANT_PAD_SLOT_ID = -1
GDN_INVARIANT_SPLITS: dict = {}


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


def gdn_invariant_rebase_checkpoint(checkpoint, num_decodes):
    """The prefill checkpoint rows of the prefill tail.

    The builder lays out one checkpoint row per non-spec request, decodes first; a decode
    row never holds a checkpoint (its one-token query cannot contain one). The tail's rows
    are the last ones, with ``request_rows`` counted from the first prefill.
    """
    if checkpoint is None:
        return None
    names = {f.name for f in dataclasses.fields(checkpoint)}
    rebased = {
        "checkpoint_offsets": checkpoint.checkpoint_offsets[num_decodes:],
        "state_indices": checkpoint.state_indices[num_decodes:],
    }
    for name in ("offsets", "query_lens", "block_cols"):
        if name in names and getattr(checkpoint, name) is not None:
            rebased[name] = getattr(checkpoint, name)[num_decodes:]
    if "request_rows" in names and checkpoint.request_rows is not None:
        rebased["request_rows"] = checkpoint.request_rows[num_decodes:] - num_decodes
    return dataclasses.replace(checkpoint, **rebased)


def gdn_invariant_rebase_flashinfer_plan(plan, num_decodes):
    """FlashInfer's checkpoint plan for the prefill tail.

    ``cu_starts``, ``every_n_tokens`` and ``num_checkpoints`` already count the prefill
    rows only (decode rows have checkpoint offset 0); ``rows`` has one entry per checkpoint
    row, decodes first.
    """
    if plan is None:
        return None
    return dataclasses.replace(plan, rows=plan.rows[num_decodes:])


def gdn_invariant_build_split(attn_metadata):
    """The (decode-only, prefill-only) metadata views of a mixed step."""
    num_decodes = attn_metadata.num_decodes
    num_decode_tokens = attn_metadata.num_decode_tokens
    state_indices = attn_metadata.non_spec_state_indices_tensor
    has_initial_state = attn_metadata.has_initial_state
    decode_fields = dict(
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
    prefill_fields = dict(
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
    if getattr(attn_metadata, "checkpoint", None) is not None:
        decode_fields["checkpoint"] = None
        prefill_fields["checkpoint"] = gdn_invariant_rebase_checkpoint(
            attn_metadata.checkpoint, num_decodes
        )
    if getattr(attn_metadata, "flashinfer_checkpoint_plan", None) is not None:
        decode_fields["flashinfer_checkpoint_plan"] = None
        prefill_fields["flashinfer_checkpoint_plan"] = gdn_invariant_rebase_flashinfer_plan(
            attn_metadata.flashinfer_checkpoint_plan, num_decodes
        )
    return (
        dataclasses.replace(attn_metadata, **decode_fields),
        dataclasses.replace(attn_metadata, **prefill_fields),
    )


def gdn_invariant_split_mixed_step(attn_metadata):
    """The split of ``attn_metadata``, built once per metadata object (layers share it)."""
    key = id(attn_metadata)
    cached = GDN_INVARIANT_SPLITS.get(key)
    if cached is not None and cached[0]() is attn_metadata:
        return cached[1]
    split = gdn_invariant_build_split(attn_metadata)

    def forget(_ref, key=key):
        GDN_INVARIANT_SPLITS.pop(key, None)

    GDN_INVARIANT_SPLITS[key] = (weakref.ref(attn_metadata, forget), split)
    return split


def gdn_invariant_routes(layer, attn_metadata):
    """Whether this step's decode rows take the decode-only path (a mixed non-spec step
    whose decode rows carry one token each)."""
    return (
        attn_metadata is not None
        and layer.enable_packed_recurrent_decode
        and attn_metadata.spec_sequence_masks is None
        and attn_metadata.num_prefills > 0
        and attn_metadata.num_decodes > 0
        and attn_metadata.num_decode_tokens == attn_metadata.num_decodes
    )


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
