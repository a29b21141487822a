"""GPU: vLLM's real ``_forward_core`` in mode golden gives decode rows the goldens' bits, in
decode-only and mixed steps (so those rows are also invariant across the compositions).

Skipped without CUDA; the patches are applied for this module and reverted.
"""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.layer import (
    QWEN3_NEXT_DIMS,
    QWEN3_NEXT_TP4_DIMS,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
    step_requests,
)
from gdn_evidence.harness.mixed_step import COMPOSITIONS
from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.patches.golden_decode import golden_decode_patches
from vllm_gdn_invariant.shadow.bits import same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = torch.device("cuda")
CASE_COMPOSITIONS = 3  # the routing evidence runs all; the goldens on a GPU are slow


@pytest.fixture(scope="module")
def golden_mode():
    with applied([routing_patch(), *golden_decode_patches()]):
        yield


def golden_rows(state, inputs, d):
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    mixed_qkv, b, a = (t[:d] for t in inputs)
    indices = torch.arange(1, d + 1, device=CUDA)
    weight = state.conv_weight.view(state.conv_weight.shape[0], -1)
    conv_out, new_conv = conv_update(
        mixed_qkv, state.conv_state, weight, indices, dim_first=is_conv_state_dim_first()
    )
    heads_k = (mixed_qkv.shape[1] - state.ssm_state.shape[1] * state.ssm_state.shape[2]) // (
        2 * state.ssm_state.shape[3]
    )
    out, new_state = recurrent_step(
        conv_out,
        a,
        b,
        state.A_log,
        state.dt_bias,
        state.ssm_state,
        indices,
        num_k_heads=heads_k,
        scale=state.ssm_state.shape[3] ** -0.5,
    )
    return out.squeeze(1), new_conv[indices], new_state[indices]


@pytest.mark.parametrize("dims", [QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS], ids=["tp1", "tp4"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_rows_are_the_goldens_bits_in_decode_only_and_mixed_steps(
    golden_mode, dims, state_dtype
):
    vllm_config = make_vllm_config(dims, state_dtype)
    for seed, composition in enumerate(COMPOSITIONS[:CASE_COMPOSITIONS]):
        g = torch.Generator().manual_seed(seed)
        requests = step_requests(
            composition.decodes, composition.prefills, composition.fresh_prefill
        )
        state0 = make_layer_state(dims, state_dtype, len(requests) + 2, CUDA, g)
        inputs = step_inputs(dims, sum(r.query_len for r in requests), CUDA, g)
        mixed_meta = build_metadata(vllm_config, requests, CUDA)
        d = mixed_meta.num_decodes
        want_out, want_conv, want_state = golden_rows(state0, inputs, d)
        blocks = slice(1, d + 1)
        for meta, step_inputs_ in (
            (build_metadata(vllm_config, requests[:d], CUDA), tuple(t[:d] for t in inputs)),
            (mixed_meta, inputs),
        ):
            state = state0.clone()
            layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
            out = run_core(layer, vllm_config, meta, *step_inputs_)
            assert same_bits(out[:d], want_out), (composition, meta.num_prefills)
            assert same_bits(state.conv_state[blocks], want_conv), composition
            assert same_bits(state.ssm_state[blocks], want_state), composition
