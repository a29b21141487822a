"""GPU: the kernels behind the batch-invariance patches, bit for bit (skipped without CUDA).

* GDN prefill (vLLM's FLA ``chunk_gated_delta_rule``, what the Triton prefill backend runs):
  a sequence's output and final state are the same bits alone and among other sequences of
  a varlen batch; a prompt split on the 64-token grid with a float32 carried state gives the
  bits of the unsplit prompt, and splits off the grid or a bfloat16 carry do not (negative
  controls: the comparison can fail).
* Gated RMSNorm (``rmsnorm_fn``) with the plugin's one-row tile: a row alone and among 20,000
  rows gives the same bits.
* Fused MoE (``fused_experts``) under ``VLLM_BATCH_INVARIANT=1``: a token alone (vLLM's
  small-batch path without block alignment) and among 63 others (aligned path) gives the same
  bits. vLLM #57016 reports MoE experts that are not batch-invariant under the flag; this pins
  what the tiny models' bfloat16 experts do on this device.
"""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.autotune import autotuned_configs
from gdn_evidence.harness.chunk_prefill import cu_seqlens, varlen_inputs
from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_gated_norm import gated_norm_patches
from vllm_gdn_invariant.shadow.bits import same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

HV, K, V = 8, 128, 128
GRID = 64


def sequences(lengths: list[int], seed: int):
    """Varlen GDN prefill inputs (B = 1) on the GPU: q, k, v, g, beta."""
    return varlen_inputs(sum(lengths), seed, HV, K, V, "cuda")


def prefill(q, k, v, decay, beta, lengths: list[int], initial=None):
    """vLLM's FLA chunk prefill over ``lengths`` (output, float32 final states)."""
    from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule

    cu = cu_seqlens(lengths, "cuda")
    if initial is None:
        initial = torch.zeros(len(lengths), HV, V, K, dtype=torch.float32, device="cuda")
    out, final = chunk_gated_delta_rule(
        q=q,
        k=k,
        v=v,
        g=decay,
        beta=beta,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    return out, final


def rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return tensor[:, start:stop]


@pytest.mark.parametrize("target_len", [1, 63, 200, 700])
def test_a_prefill_sequence_gets_the_same_bits_alone_and_among_others(target_len):
    others = [300, 17, 1024, 64, 5]
    lengths = others[:2] + [target_len] + others[2:]
    inputs = sequences(lengths, seed=target_len)
    start = sum(lengths[:2])
    out, final = prefill(*inputs, lengths)
    alone_inputs = [rows(t, start, start + target_len) for t in inputs]
    out_alone, final_alone = prefill(*alone_inputs, [target_len])
    again, _ = prefill(*[t.clone() for t in alone_inputs], [target_len])
    configs = autotuned_configs()  # named on failure: the config is fixed per process
    assert same_bits(again, out_alone), ("not repeatable alone", configs)
    assert same_bits(rows(out, start, start + target_len), out_alone), configs
    assert same_bits(final[2:3], final_alone), configs


def split_prefill(inputs, length: int, cut: int, carry_dtype: torch.dtype):
    """The prompt in two chunks cut at ``cut``, the state carried in ``carry_dtype``."""
    first = [rows(t, 0, cut) for t in inputs]
    second = [rows(t, cut, length) for t in inputs]
    out1, state = prefill(*first, [cut])
    out2, final = prefill(*second, [length - cut], initial=state.to(carry_dtype).float())
    return torch.cat([out1, out2], dim=1), final


def test_a_split_on_the_grid_with_a_float32_state_gives_the_unsplit_bits():
    length = 700
    inputs = sequences([length], seed=1)
    out, final = prefill(*inputs, [length])
    for cut in (64, 320, 640):
        out_split, final_split = split_prefill(inputs, length, cut, torch.float32)
        assert same_bits(out_split, out), cut
        assert same_bits(final_split, final), cut


def test_negative_controls_a_split_off_the_grid_or_a_bfloat16_carry_changes_the_bits():
    length = 700
    inputs = sequences([length], seed=2)
    out, final = prefill(*inputs, [length])
    off_grid, _ = split_prefill(inputs, length, 300, torch.float32)
    assert not same_bits(off_grid, out)
    narrow, _ = split_prefill(inputs, length, 320, torch.bfloat16)
    assert not same_bits(narrow, out)


def test_gated_norm_rows_get_the_same_bits_alone_and_among_many_with_the_plugin():
    from vllm.third_party.flash_linear_attention.ops.layernorm_guard import rmsnorm_fn

    g = torch.Generator(device="cpu").manual_seed(3)
    x = torch.randn(20000, V, generator=g).to(torch.bfloat16).cuda()
    z = torch.randn(20000, V, generator=g).to(torch.bfloat16).cuda()
    weight = torch.randn(V, generator=g).to(torch.bfloat16).cuda()
    with applied(gated_norm_patches()[:1]):  # layernorm_guard's, which rmsnorm_fn launches
        many = rmsnorm_fn(x, weight, None, z=z, eps=1e-6, norm_before_gate=False)
        alone = [
            rmsnorm_fn(x[i : i + 1], weight, None, z=z[i : i + 1], eps=1e-6, norm_before_gate=False)
            for i in (0, 777, 19999)
        ]
    for i, row in zip((0, 777, 19999), alone, strict=True):
        assert same_bits(many[i : i + 1], row)


def test_fused_moe_token_gets_the_same_bits_alone_and_among_others(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    experts, hidden, inner, top = 16, 128, 64, 2  # the end-to-end Qwen3-Next's MoE
    g = torch.Generator(device="cpu").manual_seed(4)
    w1 = (torch.randn(experts, 2 * inner, hidden, generator=g) / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inner, generator=g) / inner**0.5).to(torch.bfloat16)
    x = torch.randn(64, hidden, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top] for _ in range(64)])
    weights = torch.rand(64, top, generator=g)
    weights = weights / weights.sum(-1, keepdim=True)
    w1, w2, x, ids, weights = (t.cuda() for t in (w1, w2, x, ids.to(torch.int32), weights))
    many = fused_experts(x, w1, w2, weights, ids, global_num_experts=experts)
    for i in (0, 31, 63):
        alone = fused_experts(
            x[i : i + 1], w1, w2, weights[i : i + 1], ids[i : i + 1], global_num_experts=experts
        )
        assert same_bits(many[i : i + 1], alone), i
