"""Inputs of the replay kernel's tests and the reference it must match: the goldens applied token
by token (``golden.conv_update``, then ``golden.recurrent_step`` on its output).

``golden_replay`` runs step i of every sequence as one batch row per sequence (a sequence whose
tokens are done is an inactive row); the goldens' rows are independent of the batch, so this is
the per-sequence, per-token composition with fewer calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from vllm_gdn_invariant.golden import conv_update, recurrent_step


@dataclass
class ReplayCase:
    """The arguments of one ``replay_tokens`` call."""

    x: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    conv_state: Tensor
    conv_indices: Tensor
    state: Tensor
    state_indices: Tensor
    cu_seqlens: Tensor
    options: dict = field(default_factory=dict)

    def tensors(self) -> tuple:
        """The positional arguments of ``replay_tokens``, in its order."""
        return (
            self.x,
            self.a,
            self.b,
            self.A_log,
            self.dt_bias,
            self.conv_weight,
            self.conv_bias,
            self.conv_state,
            self.conv_indices,
            self.state,
            self.state_indices,
            self.cu_seqlens,
        )

    def with_states_copied(self) -> ReplayCase:
        """The same case with its own copies of the two caches (for an in-place call)."""
        return replace(self, conv_state=self.conv_state.clone(), state=self.state.clone())

    @property
    def lengths(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()


def offsets(lengths: list[int], dtype: torch.dtype = torch.int32) -> Tensor:
    """cu_seqlens of sequences of ``lengths``: [0, l0, l0 + l1, ...]."""
    return torch.tensor(
        [0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=dtype
    )


def randn(
    g: torch.Generator,
    *shape: int,
    dtype: torch.dtype = torch.float32,
    scale: float = 1.0,
    device: str | torch.device = "cpu",
) -> Tensor:
    """Normal draws from ``g`` (on the CPU) times ``scale``, in ``dtype``, on ``device``."""
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def random_layer_inputs(
    g: torch.Generator,
    num_tokens: int,
    *,
    H: int,
    HV: int,
    K: int,
    V: int,
    W: int,
    x_dtype: torch.dtype,
    weight_dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> dict[str, Tensor]:
    """Random x [N, 2*H*K + HV*V], a, b [N, HV] (x_dtype), A_log in [-1, 1), dt_bias [HV]
    (float32) and conv_weight [dim, W] (weight_dtype, scale 0.5), drawn from ``g`` in that
    order."""
    dim = 2 * H * K + HV * V
    return {
        "x": randn(g, num_tokens, dim, dtype=x_dtype, device=device),
        "a": randn(g, num_tokens, HV, dtype=x_dtype, device=device),
        "b": randn(g, num_tokens, HV, dtype=x_dtype, device=device),
        "A_log": (torch.rand(HV, generator=g) * 2.0 - 1.0).to(device),
        "dt_bias": randn(g, HV, device=device),
        "conv_weight": randn(g, dim, W, dtype=weight_dtype, scale=0.5, device=device),
    }


def shuffled_blocks(
    count: int, num_blocks: int, g: torch.Generator, inactive: dict[int, int], device
) -> Tensor:
    """Distinct blocks of 1..num_blocks-1 in random order; sequence s in ``inactive`` gets the
    index ``inactive[s]`` (<= 0) instead."""
    blocks = torch.randperm(num_blocks - 1, generator=g)[:count] + 1
    for s, index in inactive.items():
        blocks[s] = index
    return blocks.to(device)


def build_replay_case(
    lengths: list[int],
    *,
    H: int = 1,
    HV: int = 2,
    K: int = 5,
    V: int = 3,
    W: int = 4,
    x_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.float32,
    conv_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    with_bias: bool = True,
    activation: str | None = "silu",
    dim_first: bool = True,
    use_qk_l2norm: bool = True,
    conv_inactive: dict[int, int] | None = None,
    state_inactive: dict[int, int] | None = None,
    extra_blocks: int = 3,
    index_dtype: torch.dtype = torch.int32,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> ReplayCase:
    """Random inputs for sequences of ``lengths`` tokens, with blocks in shuffled order (the conv
    and recurrent blocks drawn independently) and ``extra_blocks`` blocks nobody owns."""
    g = torch.Generator().manual_seed(seed)
    num = len(lengths)
    total = sum(lengths)
    dim = 2 * H * K + HV * V
    num_blocks = num + extra_blocks + 1
    conv_shape = (num_blocks, dim, W - 1) if dim_first else (num_blocks, W - 1, dim)
    layer = random_layer_inputs(
        g, total, H=H, HV=HV, K=K, V=V, W=W, x_dtype=x_dtype, weight_dtype=weight_dtype,
        device=device,
    )  # fmt: skip
    bias = randn(g, dim, dtype=weight_dtype, scale=0.5, device=device) if with_bias else None
    return ReplayCase(
        **layer,
        conv_bias=bias,
        conv_state=randn(g, *conv_shape, dtype=conv_dtype, device=device),
        conv_indices=shuffled_blocks(num, num_blocks, g, conv_inactive or {}, device).to(
            index_dtype
        ),
        state=randn(g, num_blocks, HV, V, K, dtype=state_dtype, scale=0.5, device=device),
        state_indices=shuffled_blocks(num, num_blocks, g, state_inactive or {}, device).to(
            index_dtype
        ),
        cu_seqlens=offsets(lengths, index_dtype).to(device),
        options={
            "num_k_heads": H,
            "scale": K**-0.5,
            "activation": activation,
            "use_qk_l2norm": use_qk_l2norm,
            "dim_first": dim_first,
        },
    )


def golden_replay(case: ReplayCase) -> tuple[Tensor, Tensor, Tensor]:
    """(out [N, HV, V], conv_state, state) of the goldens applied token by token, out of place."""
    options = case.options
    conv_options = {
        "bias": case.conv_bias,
        "activation": options["activation"],
        "dim_first": options["dim_first"],
    }
    recurrent_options = {
        "num_k_heads": options["num_k_heads"],
        "scale": options["scale"],
        "use_qk_l2norm": options["use_qk_l2norm"],
    }
    starts = case.cu_seqlens[:-1].tolist()
    lengths = case.lengths
    _, num_v_heads, head_v, _ = case.state.shape
    out = torch.zeros(
        (case.x.shape[0], num_v_heads, head_v), dtype=case.x.dtype, device=case.x.device
    )
    conv_state, state = case.conv_state, case.state
    zero = torch.zeros((), dtype=case.conv_indices.dtype, device=case.x.device)
    for step in range(max(lengths, default=0)):
        live = torch.tensor([step < n for n in lengths], device=case.x.device)
        rows = torch.tensor(
            [start + min(step, max(n - 1, 0)) for start, n in zip(starts, lengths, strict=True)],
            device=case.x.device,
        ).clamp(max=max(case.x.shape[0] - 1, 0))
        conv_indices = torch.where(live, case.conv_indices, zero)
        state_indices = torch.where(live, case.state_indices.to(zero.dtype), zero)
        conv_out, conv_state = conv_update(
            case.x[rows], conv_state, case.conv_weight, conv_indices, **conv_options
        )
        step_out, state = recurrent_step(
            conv_out,
            case.a[rows],
            case.b[rows],
            case.A_log,
            case.dt_bias,
            state,
            state_indices,
            **recurrent_options,
        )
        out[rows[live]] = step_out[live, 0]
    return out, conv_state, state
