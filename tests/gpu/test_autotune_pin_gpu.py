"""GPU: vLLM's FLA chunk prefill with the autotuned kernels pinned (skipped without CUDA).

Without the pin, which config an autotuner ends with changes the prefill's bits (every list
at its first config, against chunk_o alone at the config the pin keeps, as
``scripts/prefill_config_bits.py`` measured it);
with it, every forced outcome gives the bits of the pinned configs, and the pinned configs
run, repeatably (free memory filled with NaN before every run), at Qwen3-Next's and its TP4
ranks' head counts for short and long sequences.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_autotune import (
    AUTOTUNED_KERNELS,
    FLA_OPS,
    autotune_patches,
    find_autotuner,
)
from vllm_gdn_invariant.shadow.bits import same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

K = V = 128


def autotuners():
    found = []
    for module, name in AUTOTUNED_KERNELS:
        kernel = getattr(importlib.import_module(f"{FLA_OPS}.{module}"), name)
        found.append(find_autotuner(kernel))
    return found


def poison_free_memory():
    """NaN in the memory the caching allocator holds free: a kernel that reads memory it did
    not write shows it in the next run."""
    free, _ = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    junk = torch.full((max(min(reserved, free // 2), 1 << 24) // 4,), float("nan"), device="cuda")
    del junk


def prefill(lengths, heads, seed=0):
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule

    q, k, v, decay, beta = varlen_inputs(sum(lengths), seed, heads, K, V, "cuda")
    initial = torch.zeros(len(lengths), heads, V, K, dtype=torch.float32, device="cuda")
    poison_free_memory()
    out, final = chunk_gated_delta_rule(
        q=q,
        k=k,
        v=v,
        g=decay,
        beta=beta,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu_seqlens(lengths, "cuda"),
        use_qk_l2norm_in_kernel=True,
    )
    torch.cuda.synchronize()
    return out, final


def forced(monkeypatch, pick):
    """Every autotuner's timings rigged so that ``pick(configs)`` wins; caches emptied."""
    from triton.runtime.autotuner import Autotuner

    def bench(self, *args, config, **kwargs):
        return [1.0 if str(config) == str(pick(self.configs)) else 9.0] * 3

    monkeypatch.setattr(Autotuner, "_bench", bench)
    for tuner in autotuners():
        tuner.cache.clear()


original_configs: dict[int, list] = {}


def held(monkeypatch, pick):
    """Every autotuner holding only ``pick(configs)`` (what a winning config runs)."""
    for tuner in autotuners():
        configs = original_configs.setdefault(id(tuner), list(tuner.configs))
        monkeypatch.setattr(tuner, "configs", [pick(configs)])
        tuner.cache.clear()


def first(configs):
    return configs[0]


def last(configs):
    return configs[-1]


LENGTHS = [700, 17, 300]


def test_the_winning_config_changes_the_bits_without_the_pin(monkeypatch):
    """As scripts/prefill_config_bits.py measured it: every list at its first config, then
    chunk_o alone at the config the pin keeps (the others still first)."""
    from vllm_gdn_invariant.patches.bi_autotune import pinned_config

    held(monkeypatch, first)
    out_first, final_first = prefill(LENGTHS, 32, seed=11)
    chunk_o = autotuners()[[name for _, name in AUTOTUNED_KERNELS].index("chunk_fwd_kernel_o")]
    configs = list(original_configs[id(chunk_o)])
    monkeypatch.setattr(chunk_o, "configs", [pinned_config(configs)])
    chunk_o.cache.clear()
    out_pinned, final_pinned = prefill(LENGTHS, 32, seed=11)
    assert not (same_bits(out_first, out_pinned) and same_bits(final_first, final_pinned))


def test_with_the_pin_every_forced_outcome_gives_the_same_bits(monkeypatch):
    with applied(autotune_patches()):
        outs = []
        for pick in (first, last):
            forced(monkeypatch, pick)
            outs.append(prefill(LENGTHS, 32))
        assert all(len(t.configs) == 1 for t in autotuners())
    assert same_bits(outs[0][0], outs[1][0]) and same_bits(outs[0][1], outs[1][1])


@pytest.mark.parametrize("heads", [32, 8], ids=["qwen3-next", "tp4-rank"])
@pytest.mark.parametrize("lengths", [[1], [63, 64, 65], [4096, 5]], ids=str)
def test_the_pinned_configs_run_at_qwen3_next_head_counts(heads, lengths):
    with applied(autotune_patches()):
        out, final = prefill(lengths, heads, seed=len(lengths))
        again, final_again = prefill(lengths, heads, seed=len(lengths))
    assert not out.isnan().any()
    assert same_bits(out, again) and same_bits(final, final_again)
