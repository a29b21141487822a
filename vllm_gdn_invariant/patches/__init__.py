"""What the plugin changes in vLLM: one module per change, each opening with its patch note
(target, why, upstream PR, when to remove it).

* ``routing.py``: mixed-step decode rows take the decode-only kernels (modes ``route``).
  Its replacement is ``routed_forward_core.py``; ``diffs.py`` writes the same change as
  unified diffs against vLLM's source (``patches/`` at the repository root).
* ``base.py``: the patch mechanism (:class:`MethodPatch`, :class:`SourceTarget`).
"""

from __future__ import annotations

from vllm_gdn_invariant.patches.base import (
    MethodPatch,
    PatchError,
    SourceTarget,
    applied,
    apply_all,
)
from vllm_gdn_invariant.patches.routing import routing_patch

__all__ = ["MethodPatch", "PatchError", "SourceTarget", "applied", "apply_all", "routing_patch"]
