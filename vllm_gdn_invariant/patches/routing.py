"""Patch: route the decode rows of mixed decode+prefill steps through the decode-only kernels.

* **Target**: ``QwenGatedDeltaNetAttention._forward_core``
  (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``), replaced by
  :func:`~vllm_gdn_invariant.patches.routed_forward_core.routed_forward_core`; vLLM's method
  stays on the class as ``_forward_core_upstream`` and serves every step that is not split.
* **Why**: in a mixed non-speculative step vLLM runs the decode rows through
  ``causal_conv1d_fn`` + ``fused_sigmoid_gating_delta_rule_update``, in a decode-only step
  through ``causal_conv1d_update`` + ``fused_recurrent_gated_delta_rule_packed_decode``; the
  two recurrent kernels round differently, so a decode row's bits depend on whether a
  prefill shared its step. The replacement gives the decode rows of a mixed step the
  decode-only path and the prefill rows vLLM's own prefill path on a prefill-only view
  (Triton or FlashInfer prefill, with or without ``mamba_cache_mode="align"`` checkpoints).
* **Upstream**: vllm-project/vllm PR #49827 (open, not merged as of 0.34.0) routes mixed-step
  decode rows for Qwen GDN on SM90+ under batch-invariant mode.
* **Remove when**: a supported vLLM runs the decode rows of mixed steps through the
  decode-only kernels itself (PR #49827 or equivalent merged, default on); drop that version
  from the fingerprint table and this patch once it is the oldest supported.
* **Applies**: modes route and golden.

Every function the replacement relies on is named in :data:`RELIES_ON` and fingerprinted per
vLLM version (``plugin/versions.py``); the ones that exist only in some versions (prefill
checkpoints from 0.31/0.32, FlashInfer checkpoint plans from 0.33) are fingerprinted where
they exist. This module imports nothing from vLLM: the replacement lives in
``routed_forward_core.py`` and is imported only when the patch is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget

QWEN_GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_BACKEND_MODULE = "vllm.v1.attention.backends.gdn_attn"
BACKEND_UTILS_MODULE = "vllm.v1.attention.backends.utils"
CAUSAL_CONV1D_MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
CHECKPOINT_MODULE = "vllm.model_executor.layers.mamba.checkpoint"

QWEN_GDN_CLASS = "QwenGatedDeltaNetAttention"

FORWARD_CORE = SourceTarget(QWEN_GDN_MODULE, f"{QWEN_GDN_CLASS}._forward_core")
DECODE_NON_SPEC = SourceTarget(QWEN_GDN_MODULE, f"{QWEN_GDN_CLASS}._forward_core_decode_non_spec")
LAYER_FORWARD_CUDA = SourceTarget(QWEN_GDN_MODULE, f"{QWEN_GDN_CLASS}.forward_cuda")
PREFILL_DISPATCH = SourceTarget(QWEN_GDN_MODULE, "ChunkGatedDeltaRule.forward_cuda")
FLASHINFER_PREFILL = SourceTarget(QWEN_GDN_MODULE, "fi_chunk_gated_delta_rule")
FLASHINFER_PREFILL_METHOD = SourceTarget(
    QWEN_GDN_MODULE, f"{QWEN_GDN_CLASS}._forward_flashinfer_prefill"
)
METADATA_CLASS = SourceTarget(GDN_BACKEND_MODULE, "GDNAttentionMetadata")
METADATA_BUILD = SourceTarget(GDN_BACKEND_MODULE, "GDNAttentionMetadataBuilder.build")
FLASHINFER_PLAN_CLASS = SourceTarget(GDN_BACKEND_MODULE, "GDNFlashInferCheckpointPlan")
FLASHINFER_PLAN = SourceTarget(GDN_BACKEND_MODULE, "plan_flashinfer_checkpoints")
SPLIT_DECODES = SourceTarget(BACKEND_UTILS_MODULE, "split_decodes_and_prefills")
CONV_METADATA = SourceTarget(BACKEND_UTILS_MODULE, "compute_causal_conv1d_metadata")
CONV_PREFILL = SourceTarget(CAUSAL_CONV1D_MODULE, "causal_conv1d_fn")
CHECKPOINT_CLASS = SourceTarget(CHECKPOINT_MODULE, "MambaPrefillCheckpointMetadata")
CHECKPOINT_BUILD = SourceTarget(CHECKPOINT_MODULE, "MambaPrefillCheckpointBuilder.build")
CHECKPOINT_EXPORT = SourceTarget(CHECKPOINT_MODULE, "MambaPrefillCheckpointExporter.export")

RELIES_ON = (
    DECODE_NON_SPEC,  # the decode rows' path
    LAYER_FORWARD_CUDA,  # reaches _forward_core on CUDA (and which steps bypass it)
    PREFILL_DISPATCH,  # Triton / FlashInfer prefill on the tail's cu_seqlens
    FLASHINFER_PREFILL,
    FLASHINFER_PREFILL_METHOD,  # 0.34: reads the checkpoint plan and conv input of the tail
    METADATA_CLASS,  # the fields the split replaces
    METADATA_BUILD,  # decode-first order, the prefill_* fields of the tail, checkpoint rows
    FLASHINFER_PLAN_CLASS,
    FLASHINFER_PLAN,  # rows per checkpoint row, cu_starts per prefill row
    SPLIT_DECODES,  # decodes first, one token each unless speculative
    CONV_METADATA,  # the causal_conv1d_fn program tables the split rebases
    CONV_PREFILL,  # how causal_conv1d_fn reads those tables
    CHECKPOINT_CLASS,
    CHECKPOINT_BUILD,  # one checkpoint row per non-spec request, decodes first
    CHECKPOINT_EXPORT,  # reads the rows by cu_seqlens of the raw conv input
)

UPSTREAM_NAME = "_forward_core_upstream"


def load_routed_forward_core(original: Any) -> Callable[..., Any]:
    """The replacement, :func:`~.routed_forward_core.routed_forward_core` (imports vLLM);
    vLLM's method (``original``) stays on the class as ``_forward_core_upstream``."""
    from vllm_gdn_invariant.patches.routed_forward_core import routed_forward_core

    return routed_forward_core


def load_replayed_forward_core(original: Any) -> Callable[..., Any]:
    """The replacement with decode-history replay,
    :func:`~.replayed_forward_core.replayed_forward_core` (imports vLLM)."""
    from vllm_gdn_invariant.patches.replayed_forward_core import replayed_forward_core

    return replayed_forward_core


def load_golden_replayed_forward_core(original: Any) -> Callable[..., Any]:
    """The replacement with decode-history replay in one call per step (mode golden),
    :func:`~.replayed_forward_core.golden_replayed_forward_core` (imports vLLM)."""
    from vllm_gdn_invariant.patches.replayed_forward_core import golden_replayed_forward_core

    return golden_replayed_forward_core


def routing_patch(history_replay: bool = False, golden: bool = False) -> Patch:
    """The patch object (one per application: it records what it replaced).

    ``history_replay``: the replacement also replays recomputed history rows
    (``history_replay.py``); with ``golden`` (mode golden) all of a step's history tokens in one
    call of the replay kernels.
    """
    if history_replay:
        replacement = load_golden_replayed_forward_core if golden else load_replayed_forward_core
    else:
        replacement = load_routed_forward_core
    return Patch(
        target=FORWARD_CORE,
        replacement=replacement,
        keep_original_as=UPSTREAM_NAME,
        why="mixed decode+prefill steps: decode rows run causal_conv1d_update and "
        "fused_recurrent_gated_delta_rule_packed_decode, as in decode-only steps",
        relies_on=RELIES_ON,
    )
