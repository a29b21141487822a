"""Decode-history replay in mode golden on CPU, with vLLM's real metadata builder and real
``_forward_core``: every history token of a step in one call of the replay kernels (run by
Triton's interpreter here), with the bits of the rows' tokens run as decode steps one after
another (the stand-ins' decode-only pair are the goldens, which the kernels reproduce)."""

from __future__ import annotations

import pytest
import torch

from gdn_evidence.harness.layer import make_layer_state, make_vllm_config, step_inputs
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.shadow.bits import same_bits

from ..kernels.conftest import import_interpreted_submodule
from .history_steps import (
    CPU,
    DIMS,
    HISTORY,
    STEP,
    blocks_of,
    decode_steps,
    history_tokens,
    run_step,
)

pytestmark = pytest.mark.usefixtures("standin_kernels")


@pytest.fixture
def golden_in_one_call(monkeypatch):
    """Mode golden's forward core, its replay kernels run by Triton's interpreter on CPU."""
    from vllm_gdn_invariant.patches import golden_decode_step  # imports vLLM

    interpreted = import_interpreted_submodule("replay")
    monkeypatch.setattr(golden_decode_step, "replay_tokens", interpreted.replay_tokens)
    with applied([routing_patch(history_replay=True, golden=True)]):
        yield


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mode_golden_replays_the_history_rows_in_one_call_with_their_decode_steps_bits(
    golden_in_one_call, state_dtype
):
    """The stand-ins' decode-only pair are the goldens, which the replay kernels reproduce:
    all history tokens in one call give the bits of the rows' tokens run as decode steps."""
    vllm_config = make_vllm_config(DIMS, state_dtype, max_num_seqs=32, max_num_batched_tokens=512)
    g = torch.Generator().manual_seed(11)
    state = make_layer_state(DIMS, state_dtype, len(STEP) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in STEP), CPU, g)
    tokens = history_tokens(STEP, HISTORY)
    blocks = blocks_of(HISTORY)

    out, after = run_step(vllm_config, state, STEP, inputs)
    want_out, want = decode_steps(vllm_config, state, STEP, inputs, HISTORY)
    routed_out, routed = run_step(vllm_config, state, STEP, inputs, plan=False)

    assert not out.isnan().any(), "every row of core_attn_out must be written"
    assert same_bits(out[tokens], want_out[tokens])
    assert same_bits(after.ssm_state[blocks], want.ssm_state[blocks])
    assert same_bits(after.conv_state[blocks], want.conv_state[blocks])
    others = blocks_of([r for r in range(len(STEP)) if r not in HISTORY])
    assert same_bits(after.ssm_state[others], routed.ssm_state[others])
