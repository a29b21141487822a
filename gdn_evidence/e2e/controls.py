"""Negative controls of the end-to-end test, loaded as vLLM general plugins.

Not part of the installed package's entry points: ``plugin_site`` declares them only for the
evidence scripts. Each applies a subset of the plugin's patches under the same version and
fingerprint guard, all or nothing, and logs one line like the plugin.

* :func:`register_without_routing` (arm 5): every batch-invariance patch, not the routing of
  mixed-step decode rows. vLLM then runs decode rows that share a step with a prefill through
  ``causal_conv1d_fn`` + ``fused_sigmoid_gating_delta_rule_update``, and the same rows in a
  decode-only step through ``causal_conv1d_update`` + the packed decode kernel, so a request's
  bits depend on what shares its steps: the end-to-end comparison must see a difference.
"""

from __future__ import annotations

import multiprocessing
import os

from vllm_gdn_invariant.patches import apply_all, batch_invariance_patches, describe
from vllm_gdn_invariant.plugin.entry import LOGGER_NAME
from vllm_gdn_invariant.plugin.versions import check_targets, guarded_targets, installed_release
from vllm_gdn_invariant.plugin.vllm_env import BATCH_INVARIANT

_done = False


def register_without_routing() -> None:
    """Install the batch-invariance patches only (nothing outside VLLM_BATCH_INVARIANT=1)."""
    global _done
    if _done:
        return
    _done = True
    from vllm.logger import init_logger

    logger = init_logger(LOGGER_NAME)
    patches = (
        batch_invariance_patches(installed_release()) if BATCH_INVARIANT.read().enabled else []
    )
    guard = check_targets(guarded_targets(patches))
    where = f"[pid {os.getpid()} {multiprocessing.current_process().name}]"
    if guard.refusal is not None:
        logger.warning(
            "gdn_invariant control without routing: nothing patched: %s %s", guard.refusal, where
        )
        return
    apply_all(patches)
    logger.info(
        "gdn_invariant control without routing: patched %s %s",
        describe(patches) or "nothing (VLLM_BATCH_INVARIANT unset)",
        where,
    )
