"""Input builders shared by the golden tests."""

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class RecurrentCase:
    """Arguments of one recurrent_step call; ``rows`` are the per-row tensors."""

    mixed_qkv: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    state: Tensor
    state_indices: Tensor
    kwargs: dict = field(default_factory=dict)

    def args(self) -> tuple:
        return (
            self.mixed_qkv,
            self.a,
            self.b,
            self.A_log,
            self.dt_bias,
            self.state,
            self.state_indices,
        )


@dataclass
class ConvCase:
    """Arguments of one conv_update call."""

    x: Tensor
    conv_state: Tensor
    weight: Tensor
    state_indices: Tensor
    kwargs: dict = field(default_factory=dict)

    def args(self) -> tuple:
        return (self.x, self.conv_state, self.weight, self.state_indices)


def block_indices(
    batch: int, num_blocks: int, generator: torch.Generator, inactive: tuple[int, ...]
) -> Tensor:
    """Shuffled, non-contiguous active blocks in 1..num_blocks-1; rows in ``inactive`` get 0/-1."""
    blocks = torch.randperm(num_blocks - 1, generator=generator)[:batch] + 1
    for n, row in enumerate(inactive):
        blocks[row] = 0 if n % 2 == 0 else -1
    return blocks.to(torch.int32)


def build_recurrent_case(
    batch: int,
    *,
    H: int = 2,
    HV: int = 4,
    K: int = 32,
    V: int = 32,
    state_dtype: torch.dtype = torch.float32,
    mixed_dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    inactive: tuple[int, ...] = (),
    extra_blocks: int = 5,
    use_qk_l2norm: bool = True,
) -> RecurrentCase:
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + extra_blocks + 1
    width = 2 * H * K + HV * V
    return RecurrentCase(
        mixed_qkv=torch.randn(batch, width, generator=g).to(mixed_dtype),
        a=torch.randn(batch, HV, generator=g).to(mixed_dtype),
        b=torch.randn(batch, HV, generator=g).to(mixed_dtype),
        A_log=torch.rand(HV, generator=g) * 2.0 - 1.0,
        dt_bias=torch.randn(HV, generator=g),
        state=(torch.randn(num_blocks, HV, V, K, generator=g) * 0.5).to(state_dtype),
        state_indices=block_indices(batch, num_blocks, g, inactive),
        kwargs={"num_k_heads": H, "scale": K**-0.5, "use_qk_l2norm": use_qk_l2norm},
    )


def build_conv_case(
    batch: int,
    *,
    dim: int = 64,
    W: int = 4,
    cache_dtype: torch.dtype = torch.bfloat16,
    x_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    with_bias: bool = False,
    activation: str | None = "silu",
    dim_first: bool = True,
    seed: int = 0,
    inactive: tuple[int, ...] = (),
    extra_blocks: int = 5,
) -> ConvCase:
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + extra_blocks + 1
    shape = (num_blocks, dim, W - 1) if dim_first else (num_blocks, W - 1, dim)
    kwargs = {"activation": activation, "dim_first": dim_first}
    if with_bias:
        kwargs["bias"] = torch.randn(dim, generator=g).to(weight_dtype)
    return ConvCase(
        x=torch.randn(batch, dim, generator=g).to(x_dtype),
        conv_state=torch.randn(shape, generator=g).to(cache_dtype),
        weight=(torch.randn(dim, W, generator=g) * 0.5).to(weight_dtype),
        state_indices=block_indices(batch, num_blocks, g, inactive),
        kwargs=kwargs,
    )
