"""vLLM's mamba backend selector under ``VLLM_BATCH_INVARIANT=1``, called directly.

vLLM's CPU build builds the tiny Qwen3-Next's MoE layers before it selects attention backends,
and it has no MoE backend that declares batch invariance, so a CPU engine stops there under
the mode with or without the plugin (``test_engine_cpu.py``); the GDN refusal is therefore
tested here, on vLLM's real classes, and end to end on the GPU (``scripts/e2e_determinism.py``).
"""

from __future__ import annotations

import pytest
from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import KimiGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn import (
    OlmoHybridGatedDeltaNetAttention,
)
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.v1.attention import selector
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_patch import COVERAGE
from vllm_gdn_invariant.patches.bi_selector import selector_patch

REFUSAL = "VLLM batch_invariant mode is not supported for GDN_ATTN"


def bare(cls):
    """A layer object of vLLM's class without its ``__init__`` (the selector reads only its
    ``mamba_type``)."""
    return object.__new__(cls)


@pytest.fixture(autouse=True)
def batch_invariant(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    selector._cached_get_mamba_attn_backend.cache_clear()
    yield
    selector._cached_get_mamba_attn_backend.cache_clear()


@pytest.fixture
def patched():
    with applied([selector_patch()]):
        yield


def test_vllm_alone_refuses_qwen_gdn_layers():
    with pytest.raises(RuntimeError, match=REFUSAL):
        bare(QwenGatedDeltaNetAttention).get_attn_backend()


def test_qwen_gdn_layers_get_the_gdn_backend_with_the_plugin(patched):
    assert bare(QwenGatedDeltaNetAttention).get_attn_backend() is GDNAttentionBackend


def test_a_subclass_of_the_qwen_layer_counts_as_qwen(patched):
    class Swapped(QwenGatedDeltaNetAttention):  # what PluggableLayer.register_oot builds
        pass

    assert bare(Swapped).get_attn_backend() is GDNAttentionBackend


@pytest.mark.parametrize(
    "cls", [KimiGatedDeltaNetAttention, OlmoHybridGatedDeltaNetAttention], ids=["kimi", "olmo"]
)
def test_kimi_and_olmo_gdn_layers_keep_the_refusal_and_are_told_why(patched, cls):
    with pytest.raises(RuntimeError, match=REFUSAL) as info:
        bare(cls).get_attn_backend()
    assert COVERAGE in str(info.value)
    assert f"{cls.__name__} is not one" in str(info.value)


def test_other_mamba_layers_get_vllms_own_answer_unchanged(patched):
    with pytest.raises(RuntimeError, match="batch_invariant mode is not supported") as info:
        bare(MambaMixer2).get_attn_backend()
    assert COVERAGE not in str(info.value)


def test_without_batch_invariant_mode_every_gdn_layer_gets_the_gdn_backend(patched, monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    selector._cached_get_mamba_attn_backend.cache_clear()
    for cls in (QwenGatedDeltaNetAttention, KimiGatedDeltaNetAttention):
        assert bare(cls).get_attn_backend() is GDNAttentionBackend
