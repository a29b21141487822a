"""Patch: the shadow checker's hooks around the GDN decode path (``VLLM_GDN_INVARIANT_SHADOW``).

* **Targets**, each *wrapped*, not replaced: the wrapper calls the function it found (vLLM's
  own, or this plugin's replacement of it) with the same arguments and checks around it.

  - ``QwenGatedDeltaNetAttention._forward_core``
    (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``): what the custom op
    ``qwen_gdn_attention_core`` runs on CUDA (and ROCm without AITER, and vLLM 0.33+'s CPU
    path for fp16). It sees the decode rows' inputs after projection (``mixed_qkv``, ``b``,
    ``a``), the step's metadata and the layer's caches, above whatever serves the rows:
    vLLM's decode-only path, vLLM's mixed path, the routing patch (mode ``route``) or the
    golden-matched kernels (mode ``golden``, which replaces ``_forward_core_decode_non_spec``
    beneath it).
  - ``_cpu_gdn_attention_nonspec``
    (``vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py``): what vLLM's CPU path
    (``forward_cpu`` -> custom op ``cpu_gdn_attention_core``) runs without speculative
    decoding, looked up by name at each call; above vLLM's CPU kernels or, in mode ``golden``,
    the goldens (that mode replaces this function; the wrapper goes on top).
* **Why**: staging validation. For a sample of decode rows the checker copies their inputs and
  state blocks before the step, lets the serving call run, recomputes the rows with a
  reference (goldens, or vLLM's decode-only path on the copy) and records the differences
  (``vllm_gdn_invariant/shadow/``). Served results are never changed.
* **Stacking**: the routing patch (and mode golden's) replace these methods, and refuse a
  target that is not vLLM's own function. The wrappers (``wraps=True``) are applied after
  them (last in the index, ``patches/__init__.py``) and accept vLLM's function or a chain of
  this plugin's patches ending in it (each keeps what it replaced under
  ``__gdn_invariant_original__``), never another plugin's function and never a second
  wrapper. Reverting goes in reverse order, so the wrapper comes off first. The decode
  reference calls vLLM's own functions: it follows that chain down to vLLM's.
* **Upstream**: none; a checker, not a fix.
* **Remove when**: not tied to a vLLM change; the targets and everything the hooks read are
  fingerprinted per version (``plugin/versions.py``), so a vLLM that changes them is refused.
* **Applies**: with VLLM_GDN_INVARIANT_SHADOW on, in every mode.

The hooks live in ``shadow_hooks.py``, imported only when the patch is applied. Before the
wrappers are installed, the process is prepared (``prepare``): its path for the metrics to
vLLM's ``/metrics`` (``shadow/metrics.py``) and the setting the checker is built from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.golden_decode import (
    CONV_LAYOUT,
    CPU_CORE,
    CPU_NONSPEC,
    CPU_UNPACKED_WEIGHT,
    LAYER_FORWARD_CPU,
)
from vllm_gdn_invariant.patches.routing import (
    DECODE_NON_SPEC,
    FORWARD_CORE,
    LAYER_FORWARD_CUDA,
    METADATA_BUILD,
    METADATA_CLASS,
    QWEN_GDN_MODULE,
    SPLIT_DECODES,
)

if TYPE_CHECKING:
    from vllm_gdn_invariant.shadow.config import ShadowConfig

GDN_CORE_OP = SourceTarget(QWEN_GDN_MODULE, "qwen_gdn_attention_core")

CUDA_RELIES_ON = (
    GDN_CORE_OP,  # calls _forward_core with mixed_qkv, b, a after projection
    LAYER_FORWARD_CUDA,  # the projection, and the steps that reach the custom op
    DECODE_NON_SPEC,  # the decode reference; a decode-only step's rows
    METADATA_CLASS,  # num_decodes, num_decode_tokens, spec masks, non-spec state indices
    METADATA_BUILD,  # decode rows first, one state block each
    SPLIT_DECODES,
    CONV_LAYOUT,  # the conv cache's storage layout
)
CPU_RELIES_ON = (
    CPU_CORE,  # calls _cpu_gdn_attention_nonspec for the layer's metadata without spec decode
    LAYER_FORWARD_CPU,  # the projection on vLLM's CPU path
    CPU_UNPACKED_WEIGHT,  # the golden reference's conv weight (vLLM packs it for its kernels)
    METADATA_CLASS,
    METADATA_BUILD,
    SPLIT_DECODES,
    CONV_LAYOUT,
)


def wrap_forward_core(served: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper of ``_forward_core`` over ``served`` (imports the hooks, and vLLM)."""
    from vllm_gdn_invariant.patches.shadow_hooks import shadow_forward_core

    def _forward_core(*args: Any, **kwargs: Any) -> Any:
        return shadow_forward_core(served, *args, **kwargs)

    _forward_core.__doc__ = shadow_forward_core.__doc__
    return _forward_core


def wrap_cpu_nonspec(served: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper of ``_cpu_gdn_attention_nonspec`` over ``served`` (imports the hooks)."""
    from vllm_gdn_invariant.patches.shadow_hooks import shadow_cpu_gdn_attention_nonspec

    def _cpu_gdn_attention_nonspec(*args: Any, **kwargs: Any) -> Any:
        return shadow_cpu_gdn_attention_nonspec(served, *args, **kwargs)

    _cpu_gdn_attention_nonspec.__doc__ = shadow_cpu_gdn_attention_nonspec.__doc__
    return _cpu_gdn_attention_nonspec


def shadow_patches(config: ShadowConfig | None = None, mode: str = "route") -> list[Patch]:
    """The shadow checker's two wrappers (CUDA path, vLLM's CPU path); one set per application.

    Their ``prepare`` sets up this process's metrics and the setting the checker is built
    from: ``config`` with the plugin's ``mode`` (None: no checker is built; the hooks then
    serve, and check only with a checker installed by hand).
    """

    def prepare() -> None:
        from vllm_gdn_invariant.patches.shadow_hooks import prepare_process

        prepare_process(config, mode)

    return [
        Patch(
            target=FORWARD_CORE,
            replacement=wrap_forward_core,
            why="shadow checker: snapshot, serve, recompute and compare sampled decode rows",
            relies_on=CUDA_RELIES_ON,
            wraps=True,
            prepare=prepare,
            label=f"{FORWARD_CORE.qualname} (shadow)",
        ),
        Patch(
            target=CPU_NONSPEC,
            replacement=wrap_cpu_nonspec,
            why="shadow checker on vLLM's CPU path",
            relies_on=CPU_RELIES_ON,
            wraps=True,
            prepare=prepare,
            label=f"{CPU_NONSPEC.qualname} (shadow)",
        ),
    ]
