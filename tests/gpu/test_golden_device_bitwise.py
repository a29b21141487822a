"""The goldens give the same bits on CUDA as on CPU for the same inputs (skipped without CUDA).

Inputs are generated on CPU and copied to the GPU, so both devices see identical values.
Dimensions are Qwen3-Next's (H=16, HV=32, K=V=128) and its TP4 per-rank head counts (H=4, HV=8).
The last test measures the elementary functions over every fp32 value on the GPU; since the
GPU bits equal the CPU bits, the measurement holds for both.
"""

import math

import pytest
import torch
from torch import Tensor

from gdn_evidence.harness.layer import LAYOUTS
from vllm_gdn_invariant.golden import (
    conv_update,
    exp,
    fixed_order_sum,
    log1p,
    recurrent_step,
    sigmoid,
    silu,
    softplus,
    sqrt,
)
from vllm_gdn_invariant.shadow.bits import same_bits, ulp_distance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

BATCH_SIZES = (1, 4, 17, 64, 256)


def block_indices(batch: int, num_blocks: int, g: torch.Generator) -> Tensor:
    """Shuffled blocks in 1..num_blocks-1; rows 1 and B//2 inactive (0 and -1) from B=4."""
    indices = torch.randperm(num_blocks - 1, generator=g)[:batch] + 1
    if batch >= 4:
        indices[1], indices[batch // 2] = 0, -1
    return indices.to(torch.int32)


def recurrent_inputs(layout: str, batch: int, state_dtype: torch.dtype, seed: int):
    dims = LAYOUTS[layout]
    H, HV, K, V = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
    g = torch.Generator().manual_seed(seed)
    num_blocks = batch + 4
    args = (
        torch.randn(batch, dims.conv_dim, generator=g).to(torch.bfloat16),
        torch.randn(batch, HV, generator=g).to(torch.bfloat16),
        torch.randn(batch, HV, generator=g).to(torch.bfloat16),
        torch.log(torch.rand(HV, generator=g) * 15.0 + 1.0),
        torch.randn(HV, generator=g),
        (torch.randn(num_blocks, HV, V, K, generator=g) * 0.1).to(state_dtype),
        block_indices(batch, num_blocks, g),
    )
    return args, {"num_k_heads": H, "scale": K**-0.5, "use_qk_l2norm": True}


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch", BATCH_SIZES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recurrent_step_on_cuda_gives_the_cpu_bits(layout, batch, state_dtype):
    args, kwargs = recurrent_inputs(layout, batch, state_dtype, seed=batch)
    out_cpu, state_cpu = recurrent_step(*args, **kwargs)
    out_gpu, state_gpu = recurrent_step(*(t.cuda() for t in args), **kwargs)
    assert same_bits(out_gpu.cpu(), out_cpu)
    assert same_bits(state_gpu.cpu(), state_cpu)


@pytest.mark.parametrize("dim_first", [True, False], ids=["dim_first", "token_first"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_conv_update_on_cuda_gives_the_cpu_bits(layout, cache_dtype, with_bias, dim_first):
    dims = LAYOUTS[layout]
    dim, width = dims.conv_dim, dims.conv_width
    for batch in BATCH_SIZES:
        g = torch.Generator().manual_seed(batch)
        num_blocks = batch + 4
        shape = (num_blocks, dim, width - 1) if dim_first else (num_blocks, width - 1, dim)
        args = (
            torch.randn(batch, dim, generator=g).to(torch.bfloat16),
            torch.randn(shape, generator=g).to(cache_dtype),
            (torch.randn(dim, width, generator=g) * 0.5).to(torch.bfloat16),
            block_indices(batch, num_blocks, g),
        )
        bias = torch.randn(dim, generator=g).to(torch.bfloat16) if with_bias else None
        kwargs = {"activation": "silu", "dim_first": dim_first}
        out_cpu, state_cpu = conv_update(*args, bias=bias, **kwargs)
        out_gpu, state_gpu = conv_update(
            *(t.cuda() for t in args), bias=None if bias is None else bias.cuda(), **kwargs
        )
        assert same_bits(out_gpu.cpu(), out_cpu), f"B={batch}"
        assert same_bits(state_gpu.cpu(), state_cpu), f"B={batch}"


def sweep_points() -> Tensor:
    """Evenly spaced points over [-110, 110], subnormal and special inputs."""
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1e-40, 3.4e38]
    )
    return torch.cat([torch.linspace(-110.0, 110.0, 1 << 24), specials])


@pytest.mark.parametrize("function", [exp, sqrt, sigmoid, softplus, silu])
def test_elementary_functions_on_cuda_give_the_cpu_bits(function):
    x = sweep_points()
    assert same_bits(function(x.cuda()).cpu(), function(x))


def test_log1p_on_cuda_gives_the_cpu_bits():
    x = torch.cat([sweep_points().abs(), -torch.rand(1 << 20), torch.logspace(-30, 38, 1 << 20)])
    assert same_bits(log1p(x.cuda()).cpu(), log1p(x))


def test_fixed_order_sum_on_cuda_gives_the_cpu_bits():
    x = torch.randn(4096, 40, generator=torch.Generator().manual_seed(0)) * 1e3
    assert same_bits(fixed_order_sum(x.cuda()).cpu(), fixed_order_sum(x))


def every_fp32(chunk: int = 1 << 28):
    """Every fp32 bit pattern, in chunks, on the GPU."""
    for start in range(-(1 << 31), 1 << 31, chunk):
        bits = torch.arange(start, start + chunk, dtype=torch.int64, device="cuda")
        yield bits.to(torch.int32).view(torch.float32)


def float64_silu(x: Tensor) -> Tensor:
    return torch.where(torch.isneginf(x), -0.0, x * torch.sigmoid(x))


def everywhere(x: Tensor) -> Tensor:
    return torch.ones_like(x, dtype=torch.bool)


EXHAUSTIVE = {
    # function, float64 reference, inputs measured, regression bound on the ULP distance from
    # the float64 value rounded to fp32; measured max beside each (H200, torch 2.11).
    "exp": (exp, torch.exp, everywhere, 1),  # measured 1
    "log1p": (log1p, torch.log1p, everywhere, 1),  # measured 1
    "sigmoid": (sigmoid, torch.sigmoid, everywhere, 2),  # measured 2
    "softplus": (softplus, torch.nn.functional.softplus, everywhere, 2),  # measured 2
    # silu flushes to -0 below -88.72 (documented); measured above that.
    "silu": (silu, float64_silu, lambda x: x >= -88.72, 2),  # measured 2
}


@pytest.mark.parametrize("name", list(EXHAUSTIVE))
def test_elementary_error_over_every_fp32_value_stays_within_regression_bound(name):
    function, reference, measured, bound = EXHAUSTIVE[name]
    worst, where, nan_mismatches, counted = 0, math.nan, 0, 0
    for x in every_fp32():
        y = function(x)
        expected = reference(x.double()).to(torch.float32)
        nan_mismatches += int((torch.isnan(y) ^ torch.isnan(expected)).sum())
        keep = measured(x) & ~torch.isnan(expected)
        distance = ulp_distance(y[keep], expected[keep])
        counted += distance.numel()
        if distance.numel() == 0:  # a chunk of NaN bit patterns only
            continue
        i = int(distance.argmax())
        if int(distance[i]) > worst:
            worst, where = int(distance[i]), float(x[keep][i])
    print(
        f"{name}: max {worst} ULP from the rounded float64 value at x={where!r}, "
        f"{counted} inputs, {nan_mismatches} NaN mismatches"
    )
    assert nan_mismatches == 0
    assert worst <= bound
