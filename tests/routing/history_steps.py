"""The steps of the decode-history replay tests: a step of decode rows, prefills and history
rows (recomputed requests past their prompt), run through vLLM's real metadata builder and
``_forward_core`` with the history plan attached, and the same tokens as decode-only steps.
"""

from __future__ import annotations

import torch

from gdn_evidence.harness.layer import (
    LayerDims,
    Request,
    build_metadata,
    common_metadata,
    make_layer,
    run_core,
)
from vllm_gdn_invariant.patches.history_plan import PLAN_ATTR, history_plan

from . import standins

DIMS = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)
CPU = torch.device("cpu")

DECODE = Request(1, 63, False)
# Decode rows first, then prefills in the batch's order: a fresh prompt, history rows of a
# recomputed request (past its prompt), a recomputed request's prompt chunk.
STEP = [
    DECODE,
    DECODE,
    Request(9, 0, True),
    Request(7, 80, False),
    Request(12, 64, True),
    Request(5, 100, False),
    Request(2, 70, False),
]
HISTORY = [3, 5, 6]  # rows of STEP past their prompt


def new_layer(vllm_config, state):
    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    object.__setattr__(layer, "chunk_gated_delta_rule", standins.chunk_gated_delta_rule)
    return layer


def planned_metadata(vllm_config, requests, blocks=None):
    """vLLM's metadata for ``requests`` with the history plan attached as the builder patch
    attaches it."""
    metadata = build_metadata(vllm_config, requests, CPU, blocks)
    plan = history_plan(common_metadata(requests, CPU, blocks), metadata)
    if plan is not None:
        setattr(metadata, PLAN_ATTR, plan)
    return metadata


def run_step(vllm_config, state, requests, inputs, blocks=None, plan=True):
    """One step on a copy of ``state`` through the patched ``_forward_core``."""
    state = state.clone()
    layer = new_layer(vllm_config, state)
    if plan:
        metadata = planned_metadata(vllm_config, requests, blocks)
    else:
        metadata = build_metadata(vllm_config, requests, CPU, blocks)
    out = run_core(layer, vllm_config, metadata, *inputs)
    return out, state


def token_ranges(requests):
    starts, total = [], 0
    for r in requests:
        starts.append(total)
        total += r.query_len
    return starts


def decode_steps(vllm_config, state, requests, inputs, rows):
    """The rows' tokens as decode-only steps, token after token, on a copy of ``state``;
    (outputs by step token index, state after)."""
    state = state.clone()
    starts = token_ranges(requests)
    out = torch.full(
        (inputs[0].shape[0], DIMS.num_v_heads, DIMS.head_v_dim), float("nan"), dtype=torch.bfloat16
    )
    for t in range(max(requests[r].query_len for r in rows)):
        alive = [r for r in rows if requests[r].query_len > t]
        index = torch.tensor([starts[r] + t for r in alive])
        step = [Request(1, requests[r].context + t, False) for r in alive]
        layer = new_layer(vllm_config, state)
        metadata = build_metadata(vllm_config, step, CPU, [r + 1 for r in alive])
        out[index] = run_core(layer, vllm_config, metadata, *(x[index] for x in inputs))
    return out, state


def history_tokens(requests, rows):
    starts = token_ranges(requests)
    return torch.tensor([starts[r] + t for r in rows for t in range(requests[r].query_len)])


def blocks_of(rows):
    return [r + 1 for r in rows]
