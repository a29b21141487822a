"""Patch: under batch-invariant mode GDN prefill runs one implementation, Triton/FLA.

* **Target**: ``_resolve_gdn_prefill_backend``
  (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``), which both the layer's
  ``ChunkGatedDeltaRule`` and the ``GDNAttentionMetadataBuilder`` call (the builder attaches
  FlashInfer checkpoint plans only when it resolves FlashInfer), so the two stay consistent.
* **Why**: on SM90 (and SM100 with ``head_k_dim == 128``) vLLM picks FlashInfer's GDN
  prefill, and FlashInfer's ``chunk_gated_delta_rule`` defaults to ``use_cp="auto"``: on
  SM90 it switches to its context-parallel kernel when ``num_seqs * num_heads < SMs / 2``,
  so a prompt's arithmetic depends on how many other prompts share its step. vLLM never
  passes ``use_cp``. Under the mode the resolver returns ``"triton"`` whatever was
  requested: FLA's chunk kernels, whose programs each own one (sequence, 64-token chunk,
  head) of a varlen batch (chunk indices from ``cu_seqlens``) and whose autotune keys hold
  no token or sequence count, so a sequence's arithmetic does not depend on the others
  (``tests/batch_invariance/test_gpu_kernels.py`` checks it bitwise on the GPU). Triton is
  also what SGLang's deterministic mode uses for Qwen3-Next, and what vLLM runs on every
  platform without FlashInfer. The requested and the replaced backend are logged once.
* **Upstream**: none; FlashInfer's ``use_cp=False`` would be the alternative once vLLM passes
  it (vLLM PR #49827 keeps FlashInfer on SM90+).
* **Remove when**: vLLM pins the GDN prefill implementation under batch-invariant mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import GROUP
from vllm_gdn_invariant.patches.routing import PREFILL_DISPATCH, QWEN_GDN_MODULE

RESOLVE_PREFILL = SourceTarget(QWEN_GDN_MODULE, "_resolve_gdn_prefill_backend")
CHUNK_RULE_INIT = SourceTarget(QWEN_GDN_MODULE, "ChunkGatedDeltaRule.__init__")

RELIES_ON = (
    CHUNK_RULE_INIT,  # maps "triton" to forward_native (FLA's chunk_gated_delta_rule)
    PREFILL_DISPATCH,  # FlashInfer's call, which this patch keeps from running
)

TRITON = "triton"


def make_resolve(
    original: Callable[[Any], tuple[str, str]],
) -> Callable[[Any], tuple[str, str]]:
    """The replacement resolver (installed only under ``VLLM_BATCH_INVARIANT=1``)."""

    def _resolve_gdn_prefill_backend(vllm_config: Any) -> tuple[str, str]:
        requested, active = original(vllm_config)
        if active != TRITON:
            from vllm.logger import init_logger

            init_logger("vllm.gdn_invariant").info_once(
                "gdn_invariant: VLLM_BATCH_INVARIANT=1: GDN prefill runs Triton/FLA "
                "(requested %s, vLLM would run %s)",
                requested,
                active,
            )
        return requested, TRITON

    return _resolve_gdn_prefill_backend


def prefill_patch() -> Patch:
    return Patch(
        target=RESOLVE_PREFILL,
        replacement=make_resolve,
        why="one GDN prefill implementation (Triton/FLA): FlashInfer picks its context-"
        "parallel kernel from the number of sequences in the step",
        relies_on=RELIES_ON,
        label="triton-prefill",
        group=GROUP,
    )
