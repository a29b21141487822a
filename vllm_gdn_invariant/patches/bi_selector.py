"""Patch: batch-invariant mode serves Qwen GDN layers; other GDN layers keep vLLM's refusal.

* **Target**: ``MambaBase.get_attn_backend``
  (``vllm/model_executor/layers/mamba/abstract.py``), which every mamba-like layer inherits
  and which calls ``get_mamba_attn_backend`` (``vllm/v1/attention/selector.py``).
* **Why**: under ``VLLM_BATCH_INVARIANT=1`` the selector raises "VLLM batch_invariant mode is
  not supported for GDN_ATTN" because ``GDNAttentionBackend.supports_batch_invariance()`` is
  False. The selector is keyed by the backend alone, and the same backend serves Qwen, Kimi
  and Olmo GDN layers; the plugin closes the GDN sources of batch variance for
  ``QwenGatedDeltaNetAttention`` only (routing, prefill backend, chunk grid, gated norm,
  packed-decode tile: the other ``bi_*`` patches). So the decision is per layer: a
  ``QwenGatedDeltaNetAttention`` gets ``GDNAttentionBackend`` without the check; every other
  layer goes through vLLM's selector unchanged, and a GDN layer that vLLM refuses is refused
  with vLLM's message plus one sentence saying what the plugin covers. Forcing the backend's
  flag alone (vLLM issue #48613) would declare Kimi and Olmo invariant too, and would leave
  the other sources open.
* **Upstream**: vllm-project/vllm PR #49827 (open, not merged as of 0.34.0) declares
  batch-invariance support for Qwen GDN on SM90+.
* **Remove when**: a supported vLLM declares it for Qwen GDN layers and closes the sources
  itself; drop this patch for that version.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import COVERAGE, GROUP
from vllm_gdn_invariant.patches.routing import GDN_BACKEND_MODULE, QWEN_GDN_CLASS

MAMBA_ABSTRACT_MODULE = "vllm.model_executor.layers.mamba.abstract"
SELECTOR_MODULE = "vllm.v1.attention.selector"
GDN_BASE_MODULE = "vllm.model_executor.layers.mamba.gdn.base"

GET_ATTN_BACKEND = SourceTarget(MAMBA_ABSTRACT_MODULE, "MambaBase.get_attn_backend")
GET_MAMBA_BACKEND = SourceTarget(SELECTOR_MODULE, "get_mamba_attn_backend")
CACHED_MAMBA_BACKEND = SourceTarget(SELECTOR_MODULE, "_cached_get_mamba_attn_backend")
GDN_MAMBA_TYPE = SourceTarget(GDN_BASE_MODULE, "GatedDeltaNetAttention.mamba_type")
GDN_BACKEND_CLASS = SourceTarget(GDN_BACKEND_MODULE, "GDNAttentionBackend")

RELIES_ON = (
    GET_MAMBA_BACKEND,  # what the original calls
    CACHED_MAMBA_BACKEND,  # the refusal and the backend class it returns
    GDN_MAMBA_TYPE,  # GDN layers report GDN_ATTN
    GDN_BACKEND_CLASS,  # the backend Qwen layers get
)


def is_qwen_gdn_layer(layer: Any) -> bool:
    """Whether ``layer`` is vLLM's ``QwenGatedDeltaNetAttention`` (or a subclass of it)."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn

    return isinstance(layer, getattr(qwen_gdn_linear_attn, QWEN_GDN_CLASS))


def make_get_attn_backend(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The replacement ``get_attn_backend`` (installed only under ``VLLM_BATCH_INVARIANT=1``)."""

    def get_attn_backend(self: Any) -> Any:
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

        gdn = self.mamba_type == MambaAttentionBackendEnum.GDN_ATTN
        if gdn and is_qwen_gdn_layer(self):
            return self.mamba_type.get_class()
        try:
            return original(self)
        except RuntimeError as exc:
            if not gdn:
                raise
            raise RuntimeError(f"{exc} ({COVERAGE}; {type(self).__name__} is not one)") from exc

    return get_attn_backend


def selector_patch() -> Patch:
    return Patch(
        target=GET_ATTN_BACKEND,
        replacement=make_get_attn_backend,
        why="QwenGatedDeltaNetAttention gets GDNAttentionBackend under batch-invariant mode; "
        "Kimi/Olmo GDN layers keep vLLM's refusal, which says what the plugin covers",
        relies_on=RELIES_ON,
        label="qwen-gdn-backend",
        group=GROUP,
    )
