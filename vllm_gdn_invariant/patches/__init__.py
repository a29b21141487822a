"""What the plugin replaces in vLLM, and why.

* ``QwenGatedDeltaNetAttention._forward_core`` (modes route and golden) becomes
  :func:`routing.routed_forward_core`: mixed-step decode rows run the decode-only kernels
  (source 1 of the brief). It relies on ``_forward_core_decode_non_spec``,
  ``GDNAttentionMetadataBuilder.build`` and ``compute_causal_conv1d_metadata``, which the
  version guard fingerprints too.

vLLM's own ``_forward_core`` stays on the class as ``_forward_core_upstream``; the
replacement calls it for every step it does not split. ``patches/vllm-<version>/`` at the
repository root holds the same change as unified diffs.
"""

from __future__ import annotations

from vllm_gdn_invariant.patches.base import MethodPatch, PatchError, apply_all
from vllm_gdn_invariant.plugin.config import Mode, PluginConfig
from vllm_gdn_invariant.plugin.versions import (
    CONV_METADATA,
    DECODE_NON_SPEC,
    FORWARD_CORE,
    METADATA_BUILD,
)

__all__ = ["MethodPatch", "PatchError", "apply_all", "patches_for", "routing_patch"]


def routing_patch() -> MethodPatch:
    return MethodPatch(
        target=FORWARD_CORE,
        replacement="vllm_gdn_invariant.patches.routing:routed_forward_core",
        keep_original_as="_forward_core_upstream",
        why="mixed decode+prefill steps: decode rows run causal_conv1d_update and "
        "fused_recurrent_gated_delta_rule_packed_decode, as in decode-only steps",
        relies_on=(DECODE_NON_SPEC, METADATA_BUILD, CONV_METADATA),
    )


def patches_for(config: PluginConfig) -> list[MethodPatch]:
    """The patches the plugin installs for ``config`` (none in mode off)."""
    if config.mode is Mode.OFF:
        return []
    return [routing_patch()]
