"""GPU: recomputed history rows through vLLM's real kernels replay their decode steps.

A step with decode rows, prefills and history rows (requests past their prompt) goes through
vLLM's real builder and the patched ``_forward_core`` with vLLM's Triton kernels (or, in mode
golden, the golden-matched kernels, the history tokens in one call of the replay kernels); the
history rows' outputs and final states must be the
bits of the same tokens run as decode-only steps, token after token. Negative control: the
same rows left on the chunk kernels differ. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.layer import (
    QWEN3_NEXT_DIMS,
    QWEN3_NEXT_TP4_DIMS,
    Request,
    build_metadata,
    common_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
)
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.patches.golden_decode import golden_decode_patches
from vllm_gdn_invariant.patches.history_plan import PLAN_ATTR, history_plan
from vllm_gdn_invariant.shadow.bits import same_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = torch.device("cuda")
DECODE = Request(1, 63, False)
STEP = [
    DECODE,
    DECODE,
    DECODE,
    Request(96, 0, True),
    Request(40, 300, False),
    Request(64, 128, True),
    Request(17, 520, False),
    Request(2, 90, False),
]
HISTORY = [4, 6, 7]


def token_starts(requests):
    starts, total = [], 0
    for r in requests:
        starts.append(total)
        total += r.query_len
    return starts


def step(vllm_config, dims, state, requests, inputs, blocks=None, plan=True):
    state = state.clone()
    layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
    metadata = build_metadata(vllm_config, requests, CUDA, blocks)
    if plan:
        found = history_plan(common_metadata(requests, CUDA, blocks), metadata)
        if found is not None:
            setattr(metadata, PLAN_ATTR, found)
    out = run_core(layer, vllm_config, metadata, *inputs)
    torch.cuda.synchronize()
    return out, state


def decode_steps(vllm_config, dims, state, requests, inputs, rows):
    state = state.clone()
    starts = token_starts(requests)
    out = torch.full(
        (inputs[0].shape[0], dims.num_v_heads, dims.head_v_dim),
        float("nan"),
        dtype=torch.bfloat16,
        device=CUDA,
    )
    for t in range(max(requests[r].query_len for r in rows)):
        alive = [r for r in rows if requests[r].query_len > t]
        index = torch.tensor([starts[r] + t for r in alive], device=CUDA)
        decode = [Request(1, requests[r].context + t, False) for r in alive]
        layer = make_layer(vllm_config, dims, state, gqa_interleaved_layout=True)
        metadata = build_metadata(vllm_config, decode, CUDA, [r + 1 for r in alive])
        out[index] = run_core(layer, vllm_config, metadata, *(x[index] for x in inputs))
    torch.cuda.synchronize()
    return out, state


@pytest.mark.parametrize("mode", ["route", "golden"])
@pytest.mark.parametrize("dims", [QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS], ids=["tp1", "tp4"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_history_rows_get_their_decode_steps_bits_on_vllms_kernels(dims, state_dtype, mode):
    vllm_config = make_vllm_config(dims, state_dtype)
    patches = [routing_patch(history_replay=True, golden=mode == "golden")]
    if mode == "golden":
        patches += golden_decode_patches()[:1]
    g = torch.Generator().manual_seed(5)
    state = make_layer_state(dims, state_dtype, len(STEP) + 2, CUDA, g)
    inputs = step_inputs(dims, sum(r.query_len for r in STEP), CUDA, g)
    starts = token_starts(STEP)
    tokens = torch.tensor(
        [starts[r] + t for r in HISTORY for t in range(STEP[r].query_len)], device=CUDA
    )
    blocks = [r + 1 for r in HISTORY]
    with applied(patches):
        out, after = step(vllm_config, dims, state, STEP, inputs)
        want_out, want = decode_steps(vllm_config, dims, state, STEP, inputs, HISTORY)
        chunk_out, chunk = step(vllm_config, dims, state, STEP, inputs, plan=False)
    assert not out.isnan().any()
    assert same_bits(out[tokens], want_out[tokens])
    assert same_bits(after.ssm_state[blocks], want.ssm_state[blocks])
    assert same_bits(after.conv_state[blocks], want.conv_state[blocks])
    # The other rows are the routed step's.
    others = [r for r in range(len(STEP)) if r not in HISTORY]
    other_tokens = torch.tensor(
        [starts[r] + t for r in others for t in range(STEP[r].query_len)], device=CUDA
    )
    assert same_bits(out[other_tokens], chunk_out[other_tokens])
    assert same_bits(
        after.ssm_state[[r + 1 for r in others]], chunk.ssm_state[[r + 1 for r in others]]
    )
    # Negative control: on the chunk kernels the history rows' state differs.
    assert not same_bits(chunk.ssm_state[blocks], want.ssm_state[blocks])
