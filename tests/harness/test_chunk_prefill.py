"""``harness.chunk_prefill``: one seed, one set of bits; the cumulative sequence starts."""

from __future__ import annotations

import torch

from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from vllm_gdn_invariant.shadow.bits import same_bits


def test_a_seed_draws_the_same_bits_and_another_seed_others():
    first, again = varlen_inputs(70, 3, 2, 8, 4, "cpu"), varlen_inputs(70, 3, 2, 8, 4, "cpu")
    other = varlen_inputs(70, 4, 2, 8, 4, "cpu")
    assert all(same_bits(a, b) for a, b in zip(first, again, strict=True))
    assert not any(same_bits(a, b) for a, b in zip(first, other, strict=True))
    q, k, v, decay, beta = first
    assert q.shape == k.shape == (1, 70, 2, 8) and v.shape == (1, 70, 2, 4)
    assert decay.dtype == torch.float32 and bool((decay <= 0).all() and (decay >= -0.2).all())


def test_cu_seqlens_are_int32_starts():
    assert cu_seqlens([3, 4, 1], "cpu").tolist() == [0, 3, 7, 8]
    assert cu_seqlens([3], "cpu").dtype == torch.int32
