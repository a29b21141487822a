"""Under batch-invariant mode vLLM's GDN prefill backend resolves to Triton/FLA, for the layer
and for the metadata builder alike, on a platform where vLLM would pick FlashInfer."""

from __future__ import annotations

import pytest
import torch
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_prefill import prefill_patch

from .helpers import model_folder, vllm_config


class Hopper:
    """vLLM's ``current_platform`` as an SM90 CUDA device answers the resolver."""

    def is_cuda(self) -> bool:
        return True

    def is_device_capability(self, capability, device_id=None) -> bool:
        return capability == 90

    def get_cuda_runtime_major(self) -> int:
        return 13

    def __getattr__(self, name):  # is_xpu, is_rocm, families of other devices: no
        return lambda *args, **kwargs: False


@pytest.fixture(scope="module")
def config():
    return vllm_config(model_folder(), budget=256)


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(qwen, "current_platform", Hopper())


@pytest.fixture
def patched():
    with applied([prefill_patch()]):
        yield


@pytest.mark.parametrize("requested", ["auto", "flashinfer"])
def test_vllm_alone_picks_flashinfer_on_hopper(config, hopper, requested):
    config.additional_config = {"gdn_prefill_backend": requested}
    assert qwen._resolve_gdn_prefill_backend(config) == (requested, "flashinfer")


@pytest.mark.parametrize("requested", ["auto", "flashinfer", "triton"])
def test_batch_invariant_prefill_is_triton_whatever_was_requested(
    config, hopper, patched, requested
):
    config.additional_config = {"gdn_prefill_backend": requested}
    assert qwen._resolve_gdn_prefill_backend(config) == (requested, "triton")


def test_the_metadata_builder_resolves_the_same_backend(config, hopper, patched):
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    from gdn_evidence.harness.layer import PREFIX, mamba_spec

    config.additional_config = {"gdn_prefill_backend": "flashinfer"}
    with set_current_vllm_config(config):
        builder = GDNAttentionMetadataBuilder(
            kv_cache_spec=mamba_spec(config),
            layer_names=[PREFIX],
            vllm_config=config,
            device=torch.device("cpu"),
        )
    backend = getattr(builder, "gdn_prefill_backend", None)
    if backend is None:
        pytest.skip("this vLLM's builder does not resolve the prefill backend")
    assert backend == "triton"
