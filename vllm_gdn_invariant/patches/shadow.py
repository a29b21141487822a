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
* **Stacking**: the routing patch (and mode golden's) replace these methods with
  :class:`~vllm_gdn_invariant.patches.base.MethodPatch`, which refuses a target that is not
  vLLM's own function. :class:`WrapPatch` is applied after them (``plugin.entry.patches_for``
  lists it last) and accepts vLLM's function or a chain of this plugin's patches ending in it
  (each keeps what it replaced under ``__gdn_invariant_original__``), never another plugin's
  function and never a second wrapper. ``apply_all`` reverts in reverse order, so the wrapper
  comes off first. The decode reference calls vLLM's own functions: it follows that chain down
  to vLLM's.
* **Upstream**: none; a checker, not a fix.
* **Remove when**: not tied to a vLLM change; the targets and everything the hooks read are
  fingerprinted per version (``plugin/versions.py``), so a vLLM that changes them is refused.

The hooks live in ``shadow_hooks.py``, imported only when the patch is applied. Applying it
also prepares this process's path for the metrics to vLLM's ``/metrics``
(``shadow/metrics.py``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_gdn_invariant.patches.base import (
    PATCH_ATTR,
    MethodPatch,
    PatchError,
    SourceTarget,
    resolve,
)
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

GDN_CORE_OP = SourceTarget(QWEN_GDN_MODULE, "qwen_gdn_attention_core")

HOOKS = "vllm_gdn_invariant.patches.shadow_hooks"
WRAPPER_ATTR = "__gdn_invariant_shadow__"

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


def is_vllm_own(function: Callable[..., Any], target: SourceTarget) -> bool:
    """Whether ``function`` is defined in the installed file of ``target``'s module."""
    code = getattr(function, "__code__", None)
    path = target.installed_source_file()
    return (
        code is not None
        and path is not None
        and os.path.realpath(code.co_filename) == os.path.realpath(path)
    )


def vllm_own(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function at the bottom of this plugin's patch chain (vLLM's, when patched by us)."""
    while getattr(function, PATCH_ATTR, None) is not None:
        function = getattr(function, PATCH_ATTR)
    return function


@dataclass
class WrapPatch(MethodPatch):
    """Wrap ``target``: ``hook(served, *args, **kwargs)`` runs instead, where ``served`` is the
    function found there (vLLM's, or this plugin's replacement of it). ``replacement`` names the
    hook (``"module:function"``)."""

    @property
    def name(self) -> str:
        return f"{self.target.qualname} (shadow)"

    def check_unpatched(self) -> None:
        """Raise unless the live function is vLLM's own or this plugin's patch chain over it."""
        current = self.current()
        function = current
        while getattr(function, PATCH_ATTR, None) is not None:
            if getattr(function, WRAPPER_ATTR, False):
                raise PatchError(f"{self.target.key} is already wrapped by the shadow checker")
            function = getattr(function, PATCH_ATTR)
        if not is_vllm_own(function, self.target):
            raise PatchError(
                f"{self.target.key} is not vLLM's own function (replaced by another plugin?)"
            )

    def apply(self) -> None:
        self.check_unpatched()
        owner = self.owner()
        served = self.current()
        hook = resolve(self.replacement)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(served, *args, **kwargs)

        wrapper.__name__ = self.method_name
        wrapper.__qualname__ = self.target.qualname
        wrapper.__doc__ = hook.__doc__
        wrapper.__wrapped__ = served  # type: ignore[attr-defined]
        setattr(wrapper, PATCH_ATTR, served)
        setattr(wrapper, WRAPPER_ATTR, True)
        setattr(owner, self.method_name, wrapper)
        self.original = served
        importlib.import_module(HOOKS).prepare_process()

    def revert(self) -> None:
        if self.original is None:
            return
        owner = self.owner()
        live = owner.__dict__.get(self.method_name)
        if getattr(live, WRAPPER_ATTR, False) and getattr(live, PATCH_ATTR, None) is self.original:
            setattr(owner, self.method_name, self.original)
        self.original = None


def shadow_patches() -> list[MethodPatch]:
    """The shadow checker's two wrappers (CUDA path, vLLM's CPU path); one set per
    application."""
    return [
        WrapPatch(
            target=FORWARD_CORE,
            replacement=f"{HOOKS}:shadow_forward_core",
            why="shadow checker: snapshot, serve, recompute and compare sampled decode rows",
            relies_on=CUDA_RELIES_ON,
        ),
        WrapPatch(
            target=CPU_NONSPEC,
            replacement=f"{HOOKS}:shadow_cpu_gdn_attention_nonspec",
            why="shadow checker on vLLM's CPU path",
            relies_on=CPU_RELIES_ON,
        ),
    ]
