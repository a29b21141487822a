"""The patches that make ``VLLM_BATCH_INVARIANT=1`` serve Qwen GDN models (issue 9).

vLLM refuses batch-invariant mode for GDN layers; these patches declare it for
``QwenGatedDeltaNetAttention`` and close the GDN sources of batch variance that remain once
mixed-step decode rows are routed (``routing.py``). One module per vLLM change, each opening
with its patch note:

* ``bi_selector.py``: Qwen GDN layers get the GDN backend under the mode; Kimi/Olmo GDN
  layers keep vLLM's refusal, which then says what the plugin covers.
* ``bi_prefill.py``: GDN prefill resolves to Triton/FLA (FlashInfer picks context parallelism
  from the number of sequences).
* ``bi_ssm_state.py``: float32 recurrent state for Qwen GDN models (exact carry across
  prefill chunks).
* ``bi_chunk_grid.py``: non-final prefill chunks end on the 64-token kernel grid (scheduler).
* ``bi_align_block.py``: align-mode (prefix caching) block size on the 64-token grid.
* ``bi_gated_norm.py``: the gated RMSNorm after the GDN core tiles one row per program.
* ``bi_packed_decode.py``: vLLM 0.33+: the Blackwell packed-decode value tile is pinned.
* ``bi_autotune.py``: the autotuned FLA chunk-prefill kernels run one fixed config.

They are installed only when ``VLLM_BATCH_INVARIANT`` is set (read as vLLM reads it) and the
plugin's mode is not ``off``, together with the routing patch and under the same all-or-nothing
guard. This module imports nothing from vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import InvalidVersion, Version

from vllm_gdn_invariant.patches.base import MethodPatch
from vllm_gdn_invariant.patches.bi_align_block import align_block_patch
from vllm_gdn_invariant.patches.bi_autotune import autotune_patches
from vllm_gdn_invariant.patches.bi_chunk_grid import scheduler_patches
from vllm_gdn_invariant.patches.bi_gated_norm import gated_norm_patches
from vllm_gdn_invariant.patches.bi_packed_decode import packed_decode_patch
from vllm_gdn_invariant.patches.bi_patch import BatchInvariancePatch, batch_invariant_enabled
from vllm_gdn_invariant.patches.bi_prefill import prefill_patch
from vllm_gdn_invariant.patches.bi_selector import selector_patch
from vllm_gdn_invariant.patches.bi_ssm_state import ssm_state_patch

PACKED_DECODE_TILE_SINCE = Version("0.33.0")  # the Blackwell BV choice
QWEN3_5_FUSED_NORM_SINCE = Version("0.34.0")  # vllm/models/qwen3_5/nvidia/ops


def _at_least(release: str | None, version: Version) -> bool:
    if release is None:
        return True
    try:
        return Version(release) >= version
    except InvalidVersion:
        return True


def batch_invariance_patches(
    release: str | None = None, enabled: bool | None = None, history_replay: bool = False
) -> list[MethodPatch]:
    """The batch-invariance patches for vLLM ``release`` (None: every patch of every release).

    ``enabled`` None reads ``VLLM_BATCH_INVARIANT``; off, the list is empty.
    ``history_replay``: the chunk grid with the history replay's prompt-end rule.
    """
    if not (batch_invariant_enabled() if enabled is None else enabled):
        return []
    patches: list[MethodPatch] = [
        selector_patch(),
        prefill_patch(),
        ssm_state_patch(),
        *scheduler_patches(history=history_replay),
        align_block_patch(),
        *gated_norm_patches(_at_least(release, QWEN3_5_FUSED_NORM_SINCE)),
        *autotune_patches(),
    ]
    if _at_least(release, PACKED_DECODE_TILE_SINCE):
        patches.append(packed_decode_patch())
    return patches


def invariance_patches(release: str | None, history_replay: bool = False) -> list[MethodPatch]:
    """The batch-invariance patches for vLLM ``release``; none unless VLLM_BATCH_INVARIANT."""
    if not batch_invariant_enabled():
        return []
    return batch_invariance_patches(release, enabled=True, history_replay=history_replay)


def describe_patches(patches: Sequence[MethodPatch]) -> str:
    """The patches for the plugin's log line: the routing patch's target, then the
    batch-invariance patches by label (once each) after ``VLLM_BATCH_INVARIANT=1:``."""
    others = list(dict.fromkeys(p.name for p in patches if not isinstance(p, BatchInvariancePatch)))
    invariance = list(dict.fromkeys(p.name for p in patches if isinstance(p, BatchInvariancePatch)))
    text = ", ".join(others)
    if invariance:
        text += ("; " if text else "") + "VLLM_BATCH_INVARIANT=1: " + ", ".join(invariance)
    return text
