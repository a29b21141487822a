"""Under batch-invariant mode a Qwen GDN model's recurrent state is float32: vLLM's real hybrid
config hook, on the tiny Qwen3-Next's VllmConfig."""

from __future__ import annotations

import pytest
from vllm.model_executor.models.config import HybridAttentionMambaModelConfig

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_patch import BatchInvarianceConfigError
from vllm_gdn_invariant.patches.bi_ssm_state import ssm_state_patch

from .helpers import vllm_config


def hook(config, ssm_dtype):
    """Run vLLM's hook as ``VllmConfig`` does, from a cache dtype of ``ssm_dtype``. (vLLM's CPU
    platform switches GDN states to float32 itself when the config is built, so the dtype is
    set back before the hook runs.)"""
    config.cache_config.mamba_ssm_cache_dtype = ssm_dtype
    HybridAttentionMambaModelConfig.verify_and_update_config(config)
    return config.cache_config.mamba_ssm_cache_dtype


def test_vllm_alone_keeps_auto_which_is_the_model_dtype(folder):
    assert hook(vllm_config(folder, budget=256), "auto") == "auto"


def test_auto_becomes_float32_with_the_plugin(folder):
    with applied([ssm_state_patch()]):
        assert hook(vllm_config(folder, budget=256), "auto") == "float32"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_explicit_narrow_state_is_refused_with_the_reason(folder, dtype):
    with applied([ssm_state_patch()]):
        with pytest.raises(BatchInvarianceConfigError, match="--mamba-ssm-cache-dtype float32"):
            hook(vllm_config(folder, budget=256), dtype)


def test_other_hybrid_models_keep_their_dtype(folder):
    config = vllm_config(folder, budget=256)
    config.model_config.hf_text_config.model_type = "olmo_hybrid"
    config.model_config.hf_config.model_type = "olmo_hybrid"
    with applied([ssm_state_patch()]):
        assert hook(config, "bfloat16") == "bfloat16"
