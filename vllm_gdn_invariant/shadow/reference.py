"""Recompute a snapshot's decode rows with a reference: the goldens or vLLM's decode path.

All run on the snapshot's scratch caches (``m + 1`` blocks, block 0 the null block, row ``i``
in block ``i + 1``: snapshot.py), never on the live cache, and return the output rows and the
new blocks in the cache's storage layout. The kernels update a scratch cache in place: by
default on a copy of the snapshot's; with ``spend=True`` on the snapshot's own (then the
snapshot holds the new blocks: the checker spends it on its last reference).

* :func:`golden_reference`: ``golden.conv_update`` then ``golden.recurrent_step`` (the
  goldens validate the scratch indices against their state contract before computing).
  It reads the blocks through :class:`StateLayout`: the conv block as the cache stores it
  (dim-first or not) and the recurrent block as ``[HV, V, K]`` or, on vLLM's CPU path, whose
  kernels read the same ``[HV, V, K]``-shaped cache as ``[HV, K, V]``, transposed.
* :func:`golden_kernels_reference`: the same step by the golden-matched Triton kernels
  (``kernels.serving.decode_step``: two launches, bitwise the goldens, which
  tests/gpu/test_golden_device_bitwise.py pins on CUDA), for CUDA caches in vLLM's CUDA
  layout. It cannot check rows those kernels served (mode ``golden``): the checker then takes
  the goldens (checker.py, ``golden_impl``).
* :func:`decode_reference`: the platform's decode-only function of vLLM (``decode_call``) on
  a view of the layer whose ``kv_cache`` is the scratch cache, with a metadata view that
  describes a decode-only step of the sampled rows.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
from torch import Tensor

from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.kernels.serving import decode_step
from vllm_gdn_invariant.shadow.snapshot import Snapshot

GOLDENS = "goldens"  # golden_reference
GOLDEN_KERNELS = "golden-kernels"  # golden_kernels_reference
VLLM_DECODE = "vllm-decode-only"  # decode_reference


@dataclass(frozen=True)
class StateLayout:
    """How the serving path stores a layer's state blocks.

    ``conv_dim_first``: a conv block is ``[dim, W-1]`` (else ``[W-1, dim]``).
    ``recurrent_k_major``: a recurrent block, shaped ``[HV, V, K]``, holds ``h`` as
    ``[HV, K, V]`` in memory (vLLM's CPU kernels).
    """

    conv_dim_first: bool
    recurrent_k_major: bool = False

    def recurrent_logical(self, blocks: Tensor) -> Tensor:
        """Storage blocks ``[n, HV, V, K]`` -> ``h`` indexed ``[n, hv, v, k]``."""
        if not self.recurrent_k_major:
            return blocks
        n, heads, v_dim, k_dim = blocks.shape
        return blocks.reshape(n, heads, k_dim, v_dim).transpose(-1, -2)

    def recurrent_storage(self, logical: Tensor) -> Tensor:
        """Inverse of :meth:`recurrent_logical` (a contiguous tensor)."""
        if not self.recurrent_k_major:
            return logical.contiguous()
        n, heads, v_dim, k_dim = logical.shape
        return logical.transpose(-1, -2).contiguous().reshape(n, heads, v_dim, k_dim)


@dataclass(frozen=True)
class GoldenParams:
    """What the goldens need of a layer (per tensor-parallel rank)."""

    conv_weight: Tensor  # [dim, W], unpacked
    conv_bias: Tensor | None
    activation: str | None
    A_log: Tensor
    dt_bias: Tensor
    num_k_heads: int
    head_k_dim: int

    @classmethod
    def of_layer(cls, layer: Any, conv_weight: Tensor) -> GoldenParams:
        return cls(
            conv_weight=conv_weight,
            conv_bias=layer.conv1d.bias,
            activation=layer.activation,
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            num_k_heads=layer.num_k_heads // layer.tp_size,
            head_k_dim=layer.head_k_dim,
        )


@dataclass
class ReferenceResult:
    """A reference's output rows ``[m, HV, V]`` and new blocks (storage layout)."""

    output: Tensor
    recurrent_state: Tensor
    conv_state: Tensor


@functools.lru_cache(maxsize=16)
def scratch_indices(num_rows: int, device: torch.device) -> Tensor:
    """Blocks ``1..num_rows`` (int32; the same tensor for the same arguments: read only)."""
    return torch.arange(1, num_rows + 1, dtype=torch.int32, device=device)


def golden_reference(
    snapshot: Snapshot, params: GoldenParams, layout: StateLayout, out_dtype: torch.dtype
) -> ReferenceResult:
    """The goldens on the snapshot's rows."""
    m = snapshot.num_rows
    indices = scratch_indices(m, snapshot.rows.device)
    conv_out, new_conv = conv_update(
        snapshot.mixed_qkv,
        snapshot.conv_scratch,
        params.conv_weight,
        indices,
        bias=params.conv_bias,
        activation=params.activation,
        dim_first=layout.conv_dim_first,
    )
    out, new_state = recurrent_step(
        conv_out,
        snapshot.a,
        snapshot.b,
        params.A_log,
        params.dt_bias,
        layout.recurrent_logical(snapshot.ssm_scratch),
        indices,
        num_k_heads=params.num_k_heads,
        scale=params.head_k_dim**-0.5,
        use_qk_l2norm=True,
    )
    return ReferenceResult(
        output=out[:, 0].to(out_dtype),
        recurrent_state=layout.recurrent_storage(new_state[1:]),
        conv_state=new_conv[1:],
    )


def scratch_caches(snapshot: Snapshot, spend: bool) -> tuple[Tensor, Tensor]:
    """The scratch caches a kernel updates: the snapshot's own when ``spend``, else copies."""
    if spend:
        return snapshot.conv_scratch, snapshot.ssm_scratch
    return snapshot.conv_scratch.clone(), snapshot.ssm_scratch.clone()


def golden_kernels_reference(
    snapshot: Snapshot,
    params: GoldenParams,
    layout: StateLayout,
    out_dtype: torch.dtype,
    *,
    spend: bool = False,
) -> ReferenceResult:
    """The golden-matched kernels on the snapshot's rows (CUDA; bitwise
    :func:`golden_reference`)."""
    if layout.recurrent_k_major:
        raise ValueError("the golden kernels read the recurrent state as [HV, V, K] only")
    m = snapshot.num_rows
    conv, ssm = scratch_caches(snapshot, spend)
    out = decode_step(
        snapshot.mixed_qkv,
        snapshot.a,
        snapshot.b,
        params.A_log,
        params.dt_bias,
        conv,
        params.conv_weight,
        params.conv_bias,
        ssm,
        scratch_indices(m, snapshot.rows.device),
        num_k_heads=params.num_k_heads,
        scale=params.head_k_dim**-0.5,
        activation=params.activation,
        dim_first=layout.conv_dim_first,
    )
    return ReferenceResult(
        output=out[:, 0].to(out_dtype), recurrent_state=ssm[1:], conv_state=conv[1:]
    )


class LayerView:
    """The layer, except that ``kv_cache`` is another pair of tensors."""

    def __init__(self, layer: Any, kv_cache: tuple[Tensor, Tensor]) -> None:
        object.__setattr__(self, "_layer", layer)
        object.__setattr__(self, "kv_cache", kv_cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


def decode_only_metadata(attn_metadata: Any, indices: Tensor) -> Any:
    """A view of ``attn_metadata`` that describes a decode-only, non-speculative step of
    ``len(indices)`` one-token rows owning blocks ``indices``."""
    m = int(indices.numel())
    values = {}
    if is_dataclass(attn_metadata):
        values = {f.name: getattr(attn_metadata, f.name) for f in fields(attn_metadata)}
    values.update(
        num_prefills=0,
        num_prefill_tokens=0,
        num_decodes=m,
        num_decode_tokens=m,
        num_actual_tokens=m,
        non_spec_state_indices_tensor=indices,
        non_spec_query_start_loc=torch.arange(m + 1, dtype=torch.int32, device=indices.device),
        has_initial_state=None,
        spec_sequence_masks=None,
        num_accepted_tokens=None,
    )
    return types.SimpleNamespace(**values)


# decode_call(layer_view, metadata_view, mixed_qkv, b, a, core_attn_out): runs vLLM's
# decode-only path of the serving platform on the view's caches.
DecodeCall = Callable[[Any, Any, Tensor, Tensor, Tensor, Tensor], None]


def decode_reference(
    snapshot: Snapshot,
    layer: Any,
    attn_metadata: Any,
    decode_call: DecodeCall,
    out_dtype: torch.dtype,
    *,
    spend: bool = False,
) -> ReferenceResult:
    """vLLM's decode-only path on the snapshot's rows, on a scratch cache."""
    m = snapshot.num_rows
    device = snapshot.rows.device
    conv, ssm = scratch_caches(snapshot, spend)
    view = LayerView(layer, (conv, ssm))
    metadata = decode_only_metadata(attn_metadata, scratch_indices(m, device))
    heads, v_dim = ssm.shape[1], ssm.shape[2]
    out = torch.zeros((m, heads, v_dim), dtype=out_dtype, device=device)
    # vLLM's conv update writes its output over its input: give it copies unless spent.
    inputs = (snapshot.mixed_qkv, snapshot.b, snapshot.a)
    decode_call(view, metadata, *(t if spend else t.clone() for t in inputs), out)
    return ReferenceResult(output=out, recurrent_state=ssm[1:], conv_state=conv[1:])
