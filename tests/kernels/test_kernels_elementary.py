"""The kernels' device functions (kernels/elementary.py) give the goldens' bits, interpreted.

Each function runs over a sweep of fp32 values (the whole range, the hard spots and the special
values) through ``probes.apply_unary`` and is compared bit for bit with the golden's forward
function. The fixed-order sum is compared with ``golden.fixed_order_sum`` for every split of the
padded width into slabs, lanes and vectors, and the conversions with torch's.
"""

import pytest
import torch
import triton
from torch import Tensor

from vllm_gdn_invariant.golden import elementary as golden_elementary
from vllm_gdn_invariant.golden import fixed_order_sum
from vllm_gdn_invariant.shadow.bits import same_bits

# The interpreter computes with numpy, which warns where a result overflows to inf or is NaN;
# the sweeps reach those values on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1e-40, -1e-40]


def sweep() -> Tensor:
    """Evenly spaced values over [-110, 110], values next to the functions' thresholds and
    cut-offs (20, -88.72, -104, 89, 0), and the special values."""
    g = torch.Generator().manual_seed(0)
    hard = torch.tensor([20.0, -20.0, -88.72, -104.0, 89.0, 0.5, -0.5, 1.0, -1.0, 1e-30, -1e-30])
    near = hard[:, None] + torch.linspace(-1e-3, 1e-3, 257)[None, :]
    return torch.cat(
        [
            torch.linspace(-110.0, 110.0, 1 << 15),
            near.flatten(),
            torch.randn(1 << 13, generator=g) * 10.0,
            torch.tensor(SPECIALS),
        ]
    )


BLOCK = 1 << 16


def apply(probes, function, x: Tensor) -> Tensor:
    y = torch.empty(x.shape, dtype=torch.float32)
    grid = (triton.cdiv(x.numel(), BLOCK),)
    probes.apply_unary[grid](x, y, x.numel(), FUNCTION=function, BLOCK=BLOCK)
    return y


@pytest.mark.parametrize("name", ["exp", "sigmoid", "softplus", "silu", "sqrt"])
def test_device_function_gives_the_goldens_bits(kernels, probes, name):
    x = sweep()
    expected = getattr(golden_elementary, f"{name}_forward")(x)
    assert same_bits(apply(probes, getattr(kernels.elementary, name), x), expected)


def test_device_log1p_gives_the_goldens_bits(kernels, probes):
    g = torch.Generator().manual_seed(1)
    x = torch.cat(
        [
            sweep().abs(),
            -torch.rand(1 << 14, generator=g),
            torch.logspace(-30, 38, 1 << 14),
            torch.tensor([-1.0, -2.0, -0.9999, 3.4e38]),
        ]
    )
    expected = golden_elementary.log1p_forward(x)
    assert same_bits(apply(probes, kernels.elementary.log1p, x), expected)


def rows_with_hard_sums(K: int) -> Tensor:
    """Rows of random magnitudes, cancelling pairs, all -0 and mixed zeros."""
    g = torch.Generator().manual_seed(K)
    rows = [
        torch.randn(K, generator=g) * 10.0 ** torch.randint(-8, 8, (K,), generator=g),
        torch.full((K,), -0.0),
        torch.where(torch.arange(K) % 2 == 0, 0.0, -0.0),
        torch.randn(K, generator=g) * 1e30,
    ]
    cancelling = torch.randn(K, generator=g)
    cancelling[K // 2 :] = -cancelling[: K - K // 2]
    rows.append(cancelling)
    rows += [torch.randn(K, generator=g) for _ in range(3)]
    return torch.stack(rows)


def slab_splits(K: int) -> list[tuple[int, int, int]]:
    """Every (log2 J, log2 lanes, log2 vector) that splits the padded width of K."""
    width = (1 << (K - 1).bit_length()).bit_length() - 1
    return [(j, c, width - j - c) for j in range(width + 1) for c in range(width - j + 1)]


@pytest.mark.parametrize("K", [1, 2, 5, 16, 33])
def test_fixed_order_sum_slabs_gives_the_goldens_bits_for_every_split(kernels, probes, K):
    x = rows_with_hard_sums(K)
    expected = fixed_order_sum(x)
    for split in slab_splits(K):
        y = torch.empty(x.shape[0])
        probes.sum_rows[(1,)](x, y, K, x.shape[0], kernels.elementary.fixed_order_sum_slabs, *split)
        assert same_bits(y, expected), f"split (log2 J, log2 lanes, log2 vec) = {split}"


def every_bf16() -> Tensor:
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def fp32_bit_patterns() -> Tensor:
    """Random bit patterns (every exponent), bf16 and fp16 rounding ties, and the specials."""
    g = torch.Generator().manual_seed(2)
    random = torch.randint(-(1 << 31), 1 << 31, (1 << 18,), generator=g, dtype=torch.int64)
    bf16_ties = (torch.randint(0, 1 << 16, (4096,), generator=g) << 16) | 0x8000
    fp16_ties = torch.randint(0x33000000, 0x47800000, (4096,), generator=g) & ~0x1FFF | 0x1000
    bits = torch.cat([random, bf16_ties, fp16_ties]).to(torch.int32)
    return torch.cat([bits.view(torch.float32), torch.tensor(SPECIALS)])


def test_bf16_widening_is_exact_for_every_bf16(kernels, probes):
    x = every_bf16()
    y = torch.empty(x.shape, dtype=torch.float32)
    el = kernels.elementary
    probes.convert[(1,)](x, y, x.numel(), TO_FP32=el.to_fp32, ROUND_TO=el.round_to, BLOCK=BLOCK)
    assert same_bits(y, x.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rounding_from_fp32_gives_torchs_bits(kernels, probes, dtype):
    x = fp32_bit_patterns()
    y = torch.empty(x.shape, dtype=dtype)
    el = kernels.elementary
    grid = (triton.cdiv(x.numel(), BLOCK),)
    probes.convert[grid](x, y, x.numel(), TO_FP32=el.to_fp32, ROUND_TO=el.round_to, BLOCK=BLOCK)
    expected = x.to(dtype)
    nan = torch.isnan(expected)
    assert same_bits(y[~nan], expected[~nan])
    assert bool(torch.isnan(y[nan]).all())
    if dtype == torch.bfloat16:  # NaN -> 0x7FC0, as torch rounds on CPU
        assert bool((y[nan].view(torch.int16) == 0x7FC0).all())
