"""fma_fp32 is the correctly rounded fp32 ``a * b + c``: compared on bit views with the exact
rational result rounded to nearest-even, over random triples and triples whose exact result lies
just off an fp32 midpoint; negative control: float64 ``a * b + c`` rounded to fp32 (two
roundings) misses some of the latter."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_evidence.harness.fma_emulation import fma_fp32


def nearest_fp32(value: Fraction) -> np.float32:
    """``value`` rounded to the nearest fp32, ties to even (exactly, from its neighbours)."""
    guess = np.float32(float(value))
    neighbours = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.inf)]
    return min(
        neighbours,
        key=lambda f: (abs(Fraction(float(f)) - value), int(np.float32(f).view(np.int32)) & 1),
    )


def exact(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.array(
        [
            nearest_fp32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
            for x, y, z in zip(a, b, c, strict=True)
        ],
        dtype=np.float32,
    )


def random_triples(n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)

    def values() -> np.ndarray:
        scale = np.ldexp(1.0, rng.integers(-20, 20, n))
        return (rng.standard_normal(n) * scale).astype(np.float32)

    a, b = values(), values()
    cancelling = (-(a.astype(np.float64) * b) * (1 + 1e-6 * rng.standard_normal(n))).astype(
        np.float32
    )
    c = np.where(rng.random(n) < 0.5, cancelling, values()).astype(np.float32)
    return a, b, c


def near_midpoints(n: int, seed: int) -> tuple[np.ndarray, ...]:
    """c + a * b with a * b = half an ulp of c times (1 - 2^-46) or (1 + 2^-22 + 2^-46): the
    exact result just below a midpoint, or past it."""
    rng = np.random.default_rng(seed)
    exponent = rng.integers(-30, 30, n)
    significand = 2**23 + rng.integers(0, 2**23, n)
    sign = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    c = (sign * np.ldexp(significand.astype(np.float64), exponent - 23)).astype(np.float32)
    half = exponent - 24
    k = half // 2
    a = (sign * np.ldexp(1.0 + 2.0**-23, k)).astype(np.float32)
    low = np.where(rng.random(n) < 0.5, 1.0 - 2.0**-23, 1.0 + 2.0**-23)
    b = np.ldexp(low, half - k).astype(np.float32)
    return a, b, c


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.int32)


@pytest.mark.parametrize("triples", [random_triples, near_midpoints], ids=["random", "midpoints"])
def test_fma_fp32_is_the_correctly_rounded_result(triples):
    a, b, c = triples(3000, seed=1)
    got = fma_fp32(*(torch.from_numpy(v) for v in (a, b, c))).numpy()
    assert np.array_equal(bits(got), bits(exact(a, b, c)))


def test_rounding_the_float64_sum_to_fp32_misses_near_midpoints():
    a, b, c = near_midpoints(3000, seed=1)
    twice = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (bits(twice) != bits(exact(a, b, c))).sum() > 100


def test_fma_fp32_takes_fp32_tensors_only():
    x = torch.ones(2)
    with pytest.raises(TypeError, match="b must be float32"):
        fma_fp32(x, x.double(), x)


def test_the_docs_quote_the_no_fma_rules_instruction_cost():
    root = Path(__file__).resolve().parents[2]
    cases = json.loads((root / "docs/evidence/sass_mix_triton3.6.0.json").read_text())["cases"]
    bf16 = {c["arm"]: c for c in cases if (c["state"], c["batch"]) == ("bf16", 64)}
    doc = " ".join((root / "docs" / "kernels.md").read_text().split())
    assert (
        f"issues {bf16['ours_contracted']['instructions_per_element']:.2f} instead of "
        f"{bf16['ours']['instructions_per_element']:.2f} instructions per state element" in doc
    )
