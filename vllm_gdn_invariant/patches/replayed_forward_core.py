"""The replacement ``_forward_core`` with decode-history replay (patch note: ``history_replay.py``).

A step whose metadata carries a :class:`~vllm_gdn_invariant.patches.history_plan.HistoryPlan`
holds rows that recompute a preempted request's generated tokens. Those tokens' GDN states
were first built by decode steps, one token at a time; the chunk kernels would rebuild them
with other rounding. :func:`replayed_forward_core`:

1. copies the history tokens' inputs (step-major) and the history rows' conv and recurrent
   state blocks;
2. runs the step as the routing does (:func:`routed_forward_core`: decode rows on the
   decode-only path, every prefill row, history rows included, on vLLM's prefill path);
3. puts the history rows' blocks back and replays their tokens in order: step ``t`` runs
   ``_forward_core_decode_non_spec`` (vLLM's decode-only path, or mode golden's golden
   kernels, whichever the layer has) once over token ``t`` of every history row, with a
   decode-only view of the metadata for those rows, then writes the outputs in place.

The history rows' outputs and final blocks are therefore the bits of their decode steps,
token after token; every other row is exactly what the routing gives it. Steps without a plan
go to :func:`routed_forward_core` unchanged.

In mode golden the decode steps are the golden kernels', whose arithmetic the replay kernels
(``kernels/replay.py``) run over many tokens per call: :func:`golden_replayed_forward_core`
replays every history token of the step in one call (:func:`replay_history_in_one_call`, the
rows' tokens row after row) instead of one call per token position, with the same bits.
"""

from __future__ import annotations

import dataclasses

import torch

from vllm_gdn_invariant.patches import routed_forward_core as routing
from vllm_gdn_invariant.patches.golden_decode_step import golden_replay_tokens
from vllm_gdn_invariant.patches.history_plan import PLAN_ATTR, HistoryPlan


def decode_view(attn_metadata, plan: HistoryPlan, num_rows: int):
    """A decode-only view of ``attn_metadata`` for the first ``num_rows`` history rows (one
    token each), cached on the plan."""
    view = plan.views.get(num_rows)
    if view is not None:
        return view
    device = plan.state_indices.device
    fields = dict(
        num_prefills=0,
        num_prefill_tokens=0,
        num_decodes=num_rows,
        num_decode_tokens=num_rows,
        num_actual_tokens=num_rows,
        has_initial_state=None,
        non_spec_query_start_loc=torch.arange(num_rows + 1, dtype=torch.int32, device=device),
        non_spec_state_indices_tensor=plan.state_indices[:num_rows],
        chunk_indices=None,
        chunk_offsets=None,
        prefill_query_start_loc=None,
        prefill_state_indices=None,
        prefill_has_initial_state=None,
        nums_dict=None,
        batch_ptr=None,
        token_chunk_offset_ptr=None,
    )
    names = {f.name for f in dataclasses.fields(attn_metadata)}
    for name in ("checkpoint", "flashinfer_checkpoint_plan"):
        if name in names:
            fields[name] = None
    view = dataclasses.replace(attn_metadata, **fields)
    plan.views[num_rows] = view
    return view


def replay_history(
    layer,
    attn_metadata,
    plan: HistoryPlan,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Replay the plan's history tokens (inputs step-major) through the layer's decode path,
    one decode step per token position; ``out`` receives their outputs, step-major."""
    for offset, count in zip(plan.offsets, plan.counts, strict=True):
        end = offset + count
        layer._forward_core_decode_non_spec(
            mixed_qkv=mixed_qkv[offset:end],
            b=b[offset:end],
            a=a[offset:end],
            core_attn_out=out[offset:end],
            attn_metadata=decode_view(attn_metadata, plan, count),
        )


def replay_history_in_one_call(
    layer,
    attn_metadata,
    plan: HistoryPlan,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Replay the plan's history tokens (inputs row after row, ``plan.sequence_order``) as mode
    golden's decode steps in one call of the replay kernels; ``out`` receives their outputs."""
    golden_replay_tokens(layer, mixed_qkv, b, a, plan.cu_seqlens, plan.state_indices, out)


def forward_core_with_history(self, mixed_qkv, b, a, core_attn_out, *, in_one_call: bool):
    """The step as routed, then the plan's history rows replayed in place: per token position
    through the layer's decode path, or (``in_one_call``, mode golden) in one call."""
    layer_metadata = routing.get_forward_context().attn_metadata
    attn_metadata = layer_metadata.get(self.prefix) if isinstance(layer_metadata, dict) else None
    plan = getattr(attn_metadata, PLAN_ATTR, None)
    if plan is None:
        return routing.routed_forward_core(self, mixed_qkv, b, a, core_attn_out)
    order = plan.sequence_order if in_one_call else plan.order
    history_qkv = mixed_qkv.index_select(0, order)
    history_b = b.index_select(0, order)
    history_a = a.index_select(0, order)
    blocks = plan.state_indices.long()
    conv_cache, ssm_cache = self.kv_cache[0], self.kv_cache[1]
    saved_conv = conv_cache.index_select(0, blocks)
    saved_ssm = ssm_cache.index_select(0, blocks)
    routing.routed_forward_core(self, mixed_qkv, b, a, core_attn_out)
    conv_cache.index_copy_(0, blocks, saved_conv)
    ssm_cache.index_copy_(0, blocks, saved_ssm)
    history_out = core_attn_out.new_empty((plan.num_tokens, *core_attn_out.shape[1:]))
    replay = replay_history_in_one_call if in_one_call else replay_history
    replay(self, attn_metadata, plan, history_qkv, history_b, history_a, history_out)
    core_attn_out.index_copy_(0, order, history_out)


def replayed_forward_core(
    self,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
):
    """Recomputed history rows replay their decode steps; all else as routed
    (vllm-gdn-invariant)."""
    return forward_core_with_history(self, mixed_qkv, b, a, core_attn_out, in_one_call=False)


def golden_replayed_forward_core(
    self,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
):
    """Recomputed history rows replay mode golden's decode steps in one call; all else as
    routed (vllm-gdn-invariant, mode golden)."""
    return forward_core_with_history(self, mixed_qkv, b, a, core_attn_out, in_one_call=True)
