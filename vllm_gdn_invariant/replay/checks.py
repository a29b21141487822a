"""Argument checks of the replay, made before anything runs.

A response is a packed batch of sequences. Per token it is one decode step of each golden, so
the goldens' own checks apply and are called, with their error types and messages
(``golden.check_conv_dims`` with ``x``, ``conv_state``, ``conv_weight`` as ``weight`` and
``conv_bias`` as ``bias``; ``golden.check_recurrent_dims`` with ``x`` as ``mixed_qkv``, since the
recurrent step reads the conv's output, which has x's shape and dtype; the replay has no state
indices, so the goldens' index-value checks do not apply). They run on CPU stand-ins
of the arguments (``stand_in``: the same dtype and shape, no memory), so they read no device
memory; the devices are checked after them, the golden way (``golden.contract.require_tensor``).

The replay adds:

* ``state.shape[0] == conv_state.shape[0]`` (S, the number of sequences);
* ``cu_seqlens``: a 1-D int32 or int64 tensor of S + 1 offsets, on the CPU or on x's device,
  starting at 0, non-decreasing, ending at N = x.shape[0]. Its values are read on the host:
  that is a device synchronization when it lives on a GPU, none when it is on the CPU;
* a gradient needs a float32 recurrent state (``require_float32_state_for_grad``).

Bad values raise ``ValueError``, bad types and dtypes ``TypeError``, with the argument's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.golden import RecurrentDims
from vllm_gdn_invariant.golden.contract import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    require_positive_int,
    require_shape,
    require_tensor,
)

from .plan import SequencePlan


class ReplayInputs(NamedTuple):
    """The tensors of a replay, in the autograd function's order (replay_response's, with
    ``conv_bias`` after ``conv_weight``): what the forward paths take and the backward
    differentiates."""

    x: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    conv_state: Tensor
    state: Tensor


@dataclass(frozen=True)
class ReplayArgs:
    """Checked replay arguments: the recurrent dims (scale rounded to fp32), the conv width W,
    the activation and the packed batch's plan."""

    dims: RecurrentDims
    taps: int
    activation: str | None
    plan: SequencePlan


def stand_in(value: object) -> object:
    """A CPU tensor with ``value``'s dtype and shape and one element of memory (an expanded
    scalar), or ``value`` itself when it is not a tensor (the goldens then refuse it)."""
    if not isinstance(value, Tensor):
        return value
    return torch.zeros((), dtype=value.dtype).expand(value.shape)


def no_active_rows(x: object) -> Tensor:
    """Indices that mark every row of ``x`` inactive (valid for any number of blocks)."""
    rows = x.shape[0] if isinstance(x, Tensor) and x.ndim > 0 else 0
    return torch.zeros((), dtype=torch.int32).expand(rows)


def require_same_device(tensors: Mapping[str, Tensor | None], device: torch.device) -> None:
    """Every tensor on ``device`` (x's), with the goldens' message."""
    for name, value in tensors.items():
        if value is not None:
            require_tensor(
                value, name, ndim=value.ndim, dtypes=(value.dtype,), device=device, device_of="x"
            )


def check_cu_seqlens(
    cu_seqlens: object, *, num_sequences: int, num_tokens: int, device: torch.device
) -> SequencePlan:
    """``cu_seqlens``'s checks (module docstring); returns the plan of its values."""
    require_tensor(cu_seqlens, "cu_seqlens", ndim=1, dtypes=INDEX_DTYPES)
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != device:
        raise ValueError(
            f"cu_seqlens is on {cu_seqlens.device}, but x is on {device} "
            "(cu_seqlens may be on x's device or on the CPU)"
        )
    require_shape(cu_seqlens, "cu_seqlens", (num_sequences + 1,), "[S+1] (S = conv_state.shape[0])")
    offsets = cu_seqlens.tolist()  # the one read of device memory, when it is on a GPU
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    decreasing = [s for s in range(num_sequences) if offsets[s + 1] < offsets[s]]
    if decreasing:
        raise ValueError(
            f"cu_seqlens must be non-decreasing; it decreases over sequences {decreasing[:8]} "
            f"(cu_seqlens[s+1] < cu_seqlens[s])"
        )
    if offsets[-1] != num_tokens:
        raise ValueError(f"cu_seqlens must end at N = x.shape[0] = {num_tokens}, got {offsets[-1]}")
    return SequencePlan.from_offsets(offsets)


def check_replay_args(
    x: object,
    a: object,
    b: object,
    A_log: object,
    dt_bias: object,
    conv_weight: object,
    conv_state: object,
    state: object,
    cu_seqlens: object,
    *,
    num_k_heads: object,
    scale: object,
    conv_bias: object,
    activation: object,
    use_qk_l2norm: object,
) -> ReplayArgs:
    """Every check of ``replay_response`` (module docstring); raises before anything runs."""
    conv = golden.check_conv_dims(
        stand_in(x),
        stand_in(conv_state),
        stand_in(conv_weight),
        no_active_rows(x),
        bias=stand_in(conv_bias),
        activation=activation,
        dim_first=True,
    )
    dims = golden.check_recurrent_dims(
        stand_in(x),
        stand_in(a),
        stand_in(b),
        stand_in(A_log),
        stand_in(dt_bias),
        stand_in(state),
        no_active_rows(x),
        num_k_heads=num_k_heads,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    tensors = {
        "a": a,
        "b": b,
        "A_log": A_log,
        "dt_bias": dt_bias,
        "conv_weight": conv_weight,
        "conv_bias": conv_bias,
        "conv_state": conv_state,
        "state": state,
    }
    require_same_device(tensors, x.device)
    if state.shape[0] != conv_state.shape[0]:
        raise ValueError(
            f"state has {state.shape[0]} sequences (shape[0]) but conv_state has "
            f"{conv_state.shape[0]}; both hold one block per sequence"
        )
    plan = check_cu_seqlens(
        cu_seqlens,
        num_sequences=conv_state.shape[0],
        num_tokens=conv.batch,
        device=x.device,
    )
    return ReplayArgs(
        dims=dims,
        taps=conv.taps,
        activation=activation,
        plan=plan,
    )


def check_prompt_args(
    x: object,
    a: object,
    b: object,
    A_log: object,
    dt_bias: object,
    conv_weight: object,
    cu_seqlens: object,
    *,
    num_k_heads: object,
    head_k_dim: object,
    head_v_dim: object,
    conv_bias: object,
    activation: object,
    conv_state: object,
    state: object,
    conv_state_dtype: object,
) -> tuple[ReplayArgs, Tensor, Tensor]:
    """``prompt_state``'s checks: ``replay_response``'s, with both states or neither (a fresh
    prompt: zero states of the layer's shapes, the conv state in ``conv_state_dtype`` or x's
    dtype) and a float32 recurrent state (the plugin's under ``VLLM_BATCH_INVARIANT=1``).

    Returns the checked arguments and the initial states (the zero ones for a fresh prompt).
    """
    head_k = require_positive_int(head_k_dim, "head_k_dim")
    head_v = require_positive_int(head_v_dim, "head_v_dim")
    if (conv_state is None) != (state is None):
        given, missing = ("state", "conv_state") if conv_state is None else ("conv_state", "state")
        raise ValueError(
            "pass both conv_state and state (a prompt that continues from cached states) or "
            f"neither (a fresh prompt); got {given} without {missing}"
        )
    if conv_state is None:
        require_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
        require_tensor(conv_weight, "conv_weight", ndim=2, dtypes=FLOAT_DTYPES)
        require_tensor(A_log, "A_log", ndim=1, dtypes=FLOAT_DTYPES)
        require_tensor(cu_seqlens, "cu_seqlens", ndim=1, dtypes=INDEX_DTYPES)
        if conv_state_dtype is not None and conv_state_dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"conv_state_dtype must be one of {FLOAT_DTYPES}, got {conv_state_dtype!r}"
            )
        # The zero states take their shapes from the head dims: check them against x here,
        # or the goldens' check would name the shape of a state the caller did not pass.
        heads, num_v_heads = require_positive_int(num_k_heads, "num_k_heads"), A_log.shape[0]
        width = 2 * heads * head_k + num_v_heads * head_v
        if x.shape[1] != width:
            raise ValueError(
                f"x has width {x.shape[1]}, but 2*H*K + HV*V = {width} for num_k_heads={heads}, "
                f"head_k_dim={head_k}, head_v_dim={head_v} and HV={num_v_heads} (A_log.shape[0])"
            )
        sequences = max(cu_seqlens.shape[0] - 1, 0)
        conv_state = torch.zeros(
            (sequences, x.shape[1], max(conv_weight.shape[1] - 1, 0)),
            dtype=x.dtype if conv_state_dtype is None else conv_state_dtype,
            device=x.device,
        )
        state = torch.zeros(
            (sequences, A_log.shape[0], head_v, head_k), dtype=torch.float32, device=x.device
        )
    elif conv_state_dtype is not None:
        raise ValueError(
            f"conv_state_dtype={conv_state_dtype} is for a fresh prompt; conv_state has its own "
            "dtype"
        )
    elif isinstance(state, Tensor) and state.dtype != torch.float32:
        raise TypeError(
            "state must be float32 (the plugin's recurrent state under VLLM_BATCH_INVARIANT=1), "
            f"got {state.dtype}"
        )
    checked = check_replay_args(
        x,
        a,
        b,
        A_log,
        dt_bias,
        conv_weight,
        conv_state,
        state,
        cu_seqlens,
        num_k_heads=num_k_heads,
        scale=head_k**-0.5,
        conv_bias=conv_bias,
        activation=activation,
        use_qk_l2norm=True,
    )
    if (checked.dims.head_k, checked.dims.head_v) != (head_k, head_v):
        raise ValueError(
            f"state has V={checked.dims.head_v}, K={checked.dims.head_k} (shape[2:]), but "
            f"head_v_dim={head_v}, head_k_dim={head_k}"
        )
    return checked, conv_state, state


def require_float32_state_for_grad(state: Tensor, inputs: Mapping[str, Tensor | None]) -> None:
    """A gradient (grad mode on and an input that requires grad) needs a float32 ``state``."""
    if state.dtype == torch.float32 or not torch.is_grad_enabled():
        return
    wanting = [n for n, t in inputs.items() if t is not None and t.requires_grad]
    if wanting:
        raise TypeError(
            f"replay_response computes gradients with a float32 recurrent state only; state is "
            f"{state.dtype} and {', '.join(wanting)} require grad. Replay with state.float() "
            "(the rollout's bits then are those of a float32 state cache, as vLLM keeps it under "
            "VLLM_BATCH_INVARIANT=1 with this plugin), or run under torch.no_grad()"
        )
