"""What the batch-invariance patches (``bi_*.py``) share: their log-line group, the model test,
the chunk grid and the error they raise.

* :data:`GROUP`: the heading the plugin's log line lists them under.
* :func:`is_qwen_gdn_model` tells Qwen3-Next / Qwen3.5 (GDN layers of
  ``QwenGatedDeltaNetAttention``) from every other model, by the Hugging Face model type.

Whether ``VLLM_BATCH_INVARIANT`` is on is read where the plugin reads vLLM's variables
(``plugin/vllm_env.py``). This module imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any

GROUP = "VLLM_BATCH_INVARIANT=1"
# The chunk size of the GDN prefill kernels: FLA's FLA_CHUNK_SIZE and FlashInfer's GDN chunk.
CHUNK_GRID = 64
QWEN_GDN_MODEL_TYPES = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)
COVERAGE = (
    "the gdn_invariant plugin declares batch invariance for Qwen GDN layers only "
    "(QwenGatedDeltaNetAttention: Qwen3-Next, Qwen3.5)"
)


class BatchInvarianceConfigError(ValueError):
    """A configuration that batch-invariant mode cannot serve bit-exactly for a Qwen GDN model."""


def is_qwen_gdn_model(model_config: Any) -> bool:
    """Whether vLLM's ``ModelConfig`` is a Qwen3-Next / Qwen3.5 model (text or multimodal)."""
    for name in ("hf_text_config", "hf_config"):
        config = getattr(model_config, name, None)
        if getattr(config, "model_type", None) in QWEN_GDN_MODEL_TYPES:
            return True
    return False
