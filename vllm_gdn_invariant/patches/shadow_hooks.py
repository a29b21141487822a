"""The shadow checker's hooks (patch note: ``shadow.py``): what each serving path exposes.

Both hooks hand the step to :meth:`~vllm_gdn_invariant.shadow.checker.ShadowChecker.run`
with a factory of the :class:`~vllm_gdn_invariant.shadow.checker.Site` they see, built only
when the process has a checker; without one they call the served function and nothing else.

Providers (the ``provider`` of a record: what computed the decode rows):

=====================  ========================================================================
``vllm-packed-decode``  decode-only step, vLLM's ``_forward_core_decode_non_spec``
                        (``causal_conv1d_update`` + ``fused_recurrent_..._packed_decode``)
``routed``              mixed step, decode rows routed by this plugin to those same kernels
``vllm-mixed``          mixed step on vLLM's own path (``causal_conv1d_fn`` +
                        ``fused_sigmoid_gating_delta_rule_update``)
``vllm-sigmoid-gating`` ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=0``: every step on vLLM's
                        general path
``golden-kernels``      mode ``golden`` on CUDA: the golden-matched Triton kernels
``vllm-cpu``            vLLM's CPU path (its C++/torch kernels)
``goldens``             mode ``golden`` on vLLM's CPU build: the PyTorch goldens
=====================  ========================================================================
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from vllm.model_executor.layers.mamba import mamba_utils
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen
from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as cpu_gdn

from vllm_gdn_invariant.patches import routed_forward_core as routing
from vllm_gdn_invariant.patches.base import vllm_own
from vllm_gdn_invariant.patches.selection import Mode
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import metrics
from vllm_gdn_invariant.shadow.checker import Probe, Site, active_checker
from vllm_gdn_invariant.shadow.config import ShadowConfig
from vllm_gdn_invariant.shadow.reference import GoldenParams, StateLayout


def prepare_process(config: ShadowConfig | None, mode: str) -> None:
    """Run before the wrappers are installed: the path of this process's metrics to /metrics,
    and the setting this process's checker is built from (None: none is built)."""
    metrics.setup_process()
    checker_module.configure(config, mode)


def layer_metadata(forward_context: Any, layer: Any) -> Any:
    raw = getattr(forward_context, "attn_metadata", None)
    return raw.get(layer.prefix) if isinstance(raw, dict) else None


def cuda_provider(served: Any, layer: Any, attn_metadata: Any, mode: str) -> str:
    if mode == Mode.GOLDEN.value:
        return "golden-kernels"
    if not layer.enable_packed_recurrent_decode:
        return "vllm-sigmoid-gating"
    if attn_metadata.num_prefills == 0:
        return "vllm-packed-decode"
    routes = getattr(served, "__wrapped__", None) is routing.routed_forward_core
    return (
        "routed" if routes and routing.gdn_invariant_routes(layer, attn_metadata) else "vllm-mixed"
    )


def cuda_conv_weight(layer: Any) -> Tensor:
    weight = layer.conv1d.weight
    return weight.view(weight.size(0), weight.size(2))


def cuda_decode_call(
    view: Any, metadata: Any, mixed_qkv: Tensor, b: Tensor, a: Tensor, out: Tensor
) -> None:
    """vLLM's own decode-only path (``_forward_core_decode_non_spec``) on ``view``'s caches."""
    decode = vllm_own(qwen.QwenGatedDeltaNetAttention.__dict__["_forward_core_decode_non_spec"])
    decode(view, mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=out, attn_metadata=metadata)


def cuda_probe(layer: Any) -> Probe | None:
    forward_context = qwen.get_forward_context()
    attn_metadata = layer_metadata(forward_context, layer)
    return None if attn_metadata is None else Probe(forward_context, layer, attn_metadata)


def cuda_site(served: Any, probe: Probe, mode: str) -> Site:
    layer, attn_metadata = probe.layer, probe.attn_metadata
    kv_cache = layer.kv_cache
    return Site(
        layer=layer,
        attn_metadata=attn_metadata,
        conv_cache=kv_cache[0],
        ssm_cache=kv_cache[1],
        layout=StateLayout(conv_dim_first=mamba_utils.is_conv_state_dim_first()),
        provider=cuda_provider(served, layer, attn_metadata, mode),
        step_kind="decode" if attn_metadata.num_prefills == 0 else "mixed",
        golden_params=lambda: GoldenParams.of_layer(layer, cuda_conv_weight(layer)),
        decode_call=cuda_decode_call,
    )


def shadow_forward_core(
    served: Any, self: Any, mixed_qkv: Tensor, b: Tensor, a: Tensor, core_attn_out: Tensor
) -> Any:
    """``_forward_core`` with the shadow checker around it (vllm-gdn-invariant)."""

    def serve() -> Any:
        return served(self, mixed_qkv=mixed_qkv, b=b, a=a, core_attn_out=core_attn_out)

    checker = active_checker()
    if checker is None:
        return serve()
    return checker.run(
        lambda: cuda_probe(self),
        lambda probe: cuda_site(served, probe, checker.mode),
        mixed_qkv,
        b,
        a,
        core_attn_out,
        serve,
    )


def cpu_site(served: Any, probe: Probe, mode: str) -> Site:
    def decode_call(view, metadata, mixed_qkv, b, a, out) -> None:
        vllm_own(served)(view, metadata, mixed_qkv, b, a, out)

    layer, attn_metadata = probe.layer, probe.attn_metadata
    kv_cache = layer.kv_cache
    return Site(
        layer=layer,
        attn_metadata=attn_metadata,
        conv_cache=kv_cache[0],
        ssm_cache=kv_cache[1],
        layout=StateLayout(
            conv_dim_first=mamba_utils.is_conv_state_dim_first(), recurrent_k_major=True
        ),
        provider="goldens" if mode == Mode.GOLDEN.value else "vllm-cpu",
        step_kind="decode" if attn_metadata.num_prefills == 0 else "mixed",
        golden_params=lambda: GoldenParams.of_layer(layer, cpu_gdn._unpacked_conv_weight(layer)),
        decode_call=decode_call,
    )


def shadow_cpu_gdn_attention_nonspec(
    served: Any,
    layer: Any,
    attn_metadata_i: Any,
    mixed_qkv: Tensor,
    b: Tensor,
    a: Tensor,
    core_attn_out: Tensor,
) -> Any:
    """vLLM's CPU GDN core with the shadow checker around it (vllm-gdn-invariant)."""

    def serve() -> Any:
        return served(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out)

    checker = active_checker()
    if checker is None:
        return serve()
    return checker.run(
        lambda: Probe(cpu_gdn.get_forward_context(), layer, attn_metadata_i),
        lambda probe: cpu_site(served, probe, checker.mode),
        mixed_qkv,
        b,
        a,
        core_attn_out,
        serve,
    )
