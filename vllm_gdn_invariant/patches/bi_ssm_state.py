"""Patch: under batch-invariant mode a Qwen GDN model keeps its recurrent state in float32.

* **Target**: ``HybridAttentionMambaModelConfig.verify_and_update_config``
  (``vllm/model_executor/models/config.py``), which ``VllmConfig`` calls once for every hybrid
  model when the configuration is built (in the process that builds it, before it is sent to
  the engine core and the workers), after the model's own config hook (Qwen3.5's sets
  ``mamba_ssm_cache_dtype`` from its ``mamba_ssm_dtype``).
* **Why**: a chunked prefill stores the recurrent state at the end of every chunk in the SSM
  cache dtype and the next chunk starts from it; the same prompt in one chunk carries it in
  float32 inside the chunk kernel. With a bfloat16 cache the two round differently even when
  every chunk ends on the kernel's 64-token grid, so a prompt's bits would depend on how the
  token budget (shared with the other requests of the step) split it. With a float32 cache the
  carry is exact. So for Qwen3-Next / Qwen3.5 under the mode ``mamba_ssm_cache_dtype="auto"``
  becomes ``"float32"`` (Qwen3-Next's "auto" is the model dtype; Qwen3.5 checkpoints already
  ask for float32), logged once; an explicit other dtype is refused with a message that says
  why. Decode steps are unaffected in kind: they read and write the same cache either way.
  The state takes twice the memory of a bfloat16 one.
* **Upstream**: none.
* **Remove when**: vLLM carries the prefill state exactly across chunks in batch-invariant
  mode, or makes float32 the GDN state dtype there.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import (
    GROUP,
    BatchInvarianceConfigError,
    is_qwen_gdn_model,
)

MODELS_CONFIG_MODULE = "vllm.model_executor.models.config"
MAMBA_UTILS_MODULE = "vllm.model_executor.layers.mamba.mamba_utils"

HYBRID_CONFIG_HOOK = SourceTarget(
    MODELS_CONFIG_MODULE, "HybridAttentionMambaModelConfig.verify_and_update_config"
)
TRY_VERIFY = SourceTarget("vllm.config.vllm", "VllmConfig.try_verify_and_update_config")
QWEN3_5_CONFIG_HOOK = SourceTarget(
    MODELS_CONFIG_MODULE, "Qwen3_5ForConditionalGenerationConfig.verify_and_update_config"
)
GDN_STATE_DTYPE = SourceTarget(
    MAMBA_UTILS_MODULE, "MambaStateDtypeCalculator.gated_delta_net_state_dtype"
)
MAMBA_STATE_DTYPE = SourceTarget(MAMBA_UTILS_MODULE, "MambaStateDtypeCalculator._mamba_state_dtype")

RELIES_ON = (
    TRY_VERIFY,  # calls the hook once, after the model's own hook, for hybrid models
    QWEN3_5_CONFIG_HOOK,  # Qwen3.5's mamba_ssm_dtype is applied before
    GDN_STATE_DTYPE,  # GDN layers take the temporal dtype from mamba_ssm_cache_dtype
    MAMBA_STATE_DTYPE,
)

FLOAT32 = "float32"


def require_float32_state(vllm_config: Any) -> None:
    """Set a Qwen GDN model's ``mamba_ssm_cache_dtype`` "auto" to float32; refuse another one."""
    if not is_qwen_gdn_model(vllm_config.model_config):
        return
    cache_config = vllm_config.cache_config
    dtype = str(cache_config.mamba_ssm_cache_dtype)
    if dtype == FLOAT32:
        return
    if dtype == "auto":
        cache_config.mamba_ssm_cache_dtype = FLOAT32
        from vllm.logger import init_logger

        init_logger("vllm.gdn_invariant").info_once(
            "gdn_invariant: VLLM_BATCH_INVARIANT=1: GDN recurrent state in float32 "
            "(mamba_ssm_cache_dtype auto -> float32), so that a prefill split into chunks "
            "carries it exactly"
        )
        return
    raise BatchInvarianceConfigError(
        f"VLLM_BATCH_INVARIANT=1 with a Qwen GDN model needs a float32 recurrent state, but "
        f"mamba_ssm_cache_dtype={dtype!r}: a chunked prefill stores the state in that dtype "
        "at every chunk end while an unsplit prefill keeps it in float32, so a prompt's bits "
        "would depend on how the token budget split it. Pass --mamba-ssm-cache-dtype float32 "
        "(or auto)."
    )


def make_hook(original: Callable[..., None]) -> Callable[..., None]:
    """The replacement classmethod body (installed only under ``VLLM_BATCH_INVARIANT=1``)."""

    def verify_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(cls, vllm_config)
        require_float32_state(vllm_config)

    return verify_and_update_config


def ssm_state_patch() -> Patch:
    return Patch(
        target=HYBRID_CONFIG_HOOK,
        replacement=make_hook,
        why="float32 recurrent state for Qwen GDN models, so that chunk splits carry it exactly",
        relies_on=RELIES_ON,
        kind="classmethod",
        label="float32-gdn-state",
        group=GROUP,
    )
