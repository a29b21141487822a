"""Patch: in mode ``golden``, every non-speculative decode row runs the golden arithmetic.

* **Target** (CUDA): ``QwenGatedDeltaNetAttention._forward_core_decode_non_spec``
  (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``), replaced by
  :func:`~vllm_gdn_invariant.patches.golden_decode_step.golden_forward_core_decode_non_spec`:
  the conv update and the recurrent step through the golden-matched Triton kernels
  (``vllm_gdn_invariant.kernels.serving.decode_step``). vLLM calls this method for every
  decode-only non-speculative step, and the routing patch calls it for the decode rows of
  mixed steps, so every non-speculative decode row takes it. vLLM's method stays on the class
  as ``_forward_core_decode_non_spec_upstream``.
* **Target** (vLLM's CPU build): ``_cpu_gdn_attention_nonspec``
  (``vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py``), what ``forward_cpu``'s
  custom op ``cpu_gdn_attention_core`` runs without speculative decoding; replaced by
  :func:`~vllm_gdn_invariant.patches.golden_decode_step.golden_cpu_gdn_attention_nonspec`:
  decode rows through the PyTorch goldens themselves, prefill rows through vLLM's function on
  a prefill-only view of the step.
* **Why**: the trainer replays a rollout's decode step with the goldens in PyTorch; with these
  patches the rollout's decode rows are the goldens' bits (L2 at the op level). Prefill and
  speculative rows keep vLLM's kernels.
* **Upstream**: none; golden-matched kernels are this package's.
* **Remove when**: never for mode ``golden``; the targets follow vLLM's decode-path methods
  (fingerprinted per version).
* **Applies**: mode golden.

Mode ``golden`` needs vLLM's packed decode path (``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``
on, its default): with it off, vLLM runs decode-only steps through
``fused_sigmoid_gating_delta_rule_update`` without calling the target, and the plugin refuses
the combination at startup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.routing import DECODE_NON_SPEC, QWEN_GDN_MODULE

CPU_GDN_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"

CPU_NONSPEC = SourceTarget(CPU_GDN_MODULE, "_cpu_gdn_attention_nonspec")
CPU_CORE = SourceTarget(CPU_GDN_MODULE, "cpu_gdn_attention_core")
LAYER_FORWARD_CPU = SourceTarget(QWEN_GDN_MODULE, "QwenGatedDeltaNetAttention.forward_cpu")
CONV_LAYOUT = SourceTarget(
    "vllm.model_executor.layers.mamba.mamba_utils", "is_conv_state_dim_first"
)
CPU_UNPACKED_WEIGHT = SourceTarget(CPU_GDN_MODULE, "_unpacked_conv_weight")


def load_cuda_decode(original: Any) -> Callable[..., Any]:
    """The CUDA replacement (imports vLLM and the golden-matched kernels); vLLM's method stays
    on the class as ``_forward_core_decode_non_spec_upstream``."""
    from vllm_gdn_invariant.patches.golden_decode_step import (
        golden_forward_core_decode_non_spec,
    )

    return golden_forward_core_decode_non_spec


def load_cpu_decode(original: Any) -> Callable[..., Any]:
    """The CPU replacement (imports vLLM and the goldens)."""
    from vllm_gdn_invariant.patches.golden_decode_step import golden_cpu_gdn_attention_nonspec

    return golden_cpu_gdn_attention_nonspec


def golden_decode_patches() -> list[Patch]:
    """The two patch objects of mode golden (CUDA decode path, CPU decode path)."""
    return [
        Patch(
            target=DECODE_NON_SPEC,
            replacement=load_cuda_decode,
            keep_original_as="_forward_core_decode_non_spec_upstream",
            why="mode golden: non-speculative decode rows through the golden-matched kernels",
            relies_on=(CONV_LAYOUT,),
        ),
        Patch(
            target=CPU_NONSPEC,
            replacement=load_cpu_decode,
            keep_original_as="_cpu_gdn_attention_nonspec_upstream",
            why="mode golden on vLLM's CPU build: decode rows through the PyTorch goldens",
            relies_on=(CPU_CORE, LAYER_FORWARD_CPU, CPU_UNPACKED_WEIGHT, CONV_LAYOUT),
        ),
    ]
