"""Decode-history replay on CPU, with vLLM's real metadata builder and real ``_forward_core``.

A step holds decode rows, prefills (a fresh prompt and a recomputed request's prompt chunk)
and history rows (recomputed requests past their prompt). vLLM's kernels are the CPU
stand-ins of ``standins.py``: the decode-only pair are the goldens, the chunk rule a float64
recurrence, so a history row replayed through the decode path has the bits of the same
tokens run as N decode-only steps, and one left on the chunk path does not.
"""

from __future__ import annotations

import dataclasses
import logging
import types

import numpy as np
import pytest
import torch

from gdn_evidence.harness.layer import (
    Request,
    build_metadata,
    common_metadata,
    make_layer_state,
    make_vllm_config,
    step_inputs,
)
from vllm_gdn_invariant.patches import applied, routing_patch
from vllm_gdn_invariant.patches import history_replay as replay
from vllm_gdn_invariant.patches.history_plan import (
    PLAN_ATTR,
    current_past_prompt,
    history_plan,
    history_rows,
    step_past_prompt,
)
from vllm_gdn_invariant.shadow.bits import same_bits

from .history_steps import (
    CPU,
    DECODE,
    DIMS,
    HISTORY,
    STEP,
    blocks_of,
    decode_steps,
    history_tokens,
    run_step,
    token_ranges,
)

pytestmark = pytest.mark.usefixtures("standin_kernels")


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def setup(request):
    state_dtype = request.param
    return state_dtype, make_vllm_config(
        DIMS, state_dtype, max_num_seqs=32, max_num_batched_tokens=512
    )


@pytest.fixture(scope="module")
def replayed():
    with applied([routing_patch(history_replay=True)]):
        yield


def test_the_plan_names_the_rows_past_their_prompt_longest_first(setup):
    _, vllm_config = setup
    metadata = build_metadata(vllm_config, STEP, CPU)
    common = common_metadata(STEP, CPU)
    assert history_rows(common, metadata.num_decodes) == HISTORY
    plan = history_plan(common, metadata)
    assert plan.rows == (3, 5, 6) and plan.lengths == (7, 5, 2)
    assert plan.counts == (3, 3, 2, 2, 2, 1, 1)
    starts = token_ranges(STEP)
    expected = [starts[r] + t for t in range(7) for r in (3, 5, 6) if STEP[r].query_len > t]
    assert plan.order.tolist() == expected
    assert plan.state_indices.tolist() == [4, 6, 7]


def test_steps_without_history_rows_have_no_plan(setup):
    _, vllm_config = setup
    requests = [DECODE, Request(9, 0, True), Request(12, 64, True)]
    metadata = build_metadata(vllm_config, requests, CPU)
    assert history_plan(common_metadata(requests, CPU), metadata) is None
    decode_only = [DECODE, Request(1, 80, False)]
    metadata = build_metadata(vllm_config, decode_only, CPU)
    assert history_plan(common_metadata(decode_only, CPU), metadata) is None


def test_history_rows_get_the_bits_of_their_decode_steps_token_after_token(replayed, setup):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(11)
    state = make_layer_state(DIMS, state_dtype, len(STEP) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in STEP), CPU, g)
    tokens = history_tokens(STEP, HISTORY)
    blocks = blocks_of(HISTORY)

    out, after = run_step(vllm_config, state, STEP, inputs)
    want_out, want = decode_steps(vllm_config, state, STEP, inputs, HISTORY)

    assert not out.isnan().any(), "every row of core_attn_out must be written"
    assert same_bits(out[tokens], want_out[tokens])
    assert same_bits(after.ssm_state[blocks], want.ssm_state[blocks])
    assert same_bits(after.conv_state[blocks], want.conv_state[blocks])


def test_the_other_rows_of_the_step_keep_the_routed_bits(replayed, setup):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(12)
    state = make_layer_state(DIMS, state_dtype, len(STEP) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in STEP), CPU, g)
    starts = token_ranges(STEP)

    out, after = run_step(vllm_config, state, STEP, inputs)
    routed_out, routed = run_step(vllm_config, state, STEP, inputs, plan=False)
    decode_out, decode_only = run_step(vllm_config, state, STEP[:2], tuple(x[:2] for x in inputs))

    others = [r for r in range(len(STEP)) if r not in HISTORY]
    tokens = torch.tensor([starts[r] + t for r in others for t in range(STEP[r].query_len)])
    assert same_bits(out[tokens], routed_out[tokens])
    assert same_bits(out[:2], decode_out)
    for cache in ("ssm_state", "conv_state"):
        got = getattr(after, cache)
        assert same_bits(got[blocks_of(others)], getattr(routed, cache)[blocks_of(others)])
        assert same_bits(got[[1, 2]], getattr(decode_only, cache)[[1, 2]])
        # Blocks no request owns are untouched.
        assert same_bits(got[[0, len(STEP) + 1]], getattr(state, cache)[[0, len(STEP) + 1]])


def test_history_rows_on_the_chunk_path_do_not_get_the_decode_bits(replayed):
    """Negative control: the same step without a plan sends the history rows through the
    chunk rule, and the replay test's comparison fails there (float32 state: in a bf16
    state the stand-ins' difference rarely survives the store)."""
    state_dtype = torch.float32
    vllm_config = make_vllm_config(DIMS, state_dtype, max_num_seqs=32, max_num_batched_tokens=512)
    g = torch.Generator().manual_seed(11)
    state = make_layer_state(DIMS, state_dtype, len(STEP) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in STEP), CPU, g)
    blocks = blocks_of(HISTORY)

    out, after = run_step(vllm_config, state, STEP, inputs, plan=False)
    want_out, want = decode_steps(vllm_config, state, STEP, inputs, HISTORY)

    assert not same_bits(after.ssm_state[blocks], want.ssm_state[blocks])
    assert not same_bits(
        out[history_tokens(STEP, HISTORY)], want_out[history_tokens(STEP, HISTORY)]
    )


def test_a_step_of_history_rows_alone_replays_them(replayed, setup):
    state_dtype, vllm_config = setup
    requests = [Request(4, 30, False), Request(6, 50, False)]
    g = torch.Generator().manual_seed(13)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, 10, CPU, g)
    out, after = run_step(vllm_config, state, requests, inputs)
    want_out, want = decode_steps(vllm_config, state, requests, inputs, [0, 1])
    assert same_bits(out, want_out)
    assert same_bits(after.ssm_state[[1, 2]], want.ssm_state[[1, 2]])
    assert same_bits(after.conv_state[[1, 2]], want.conv_state[[1, 2]])


def test_the_builder_patch_attaches_the_plan_from_is_prefilling_with_the_v1_runner(
    monkeypatch, setup
):
    _, vllm_config = setup
    monkeypatch.setattr(replay, "replay_gaps", lambda *args: [])
    monkeypatch.setattr(replay, "runs_v1_model_runner", lambda config: True)
    with applied([replay.builder_patch()]):
        metadata = build_metadata(vllm_config, STEP, CPU)
    plan = getattr(metadata, PLAN_ATTR)
    assert plan.rows == (3, 5, 6)


# Model Runner V2 counts a recomputed request's generated tokens as prefilling.
V2_STEP = [dataclasses.replace(r, prefilling=r.query_len > 1) for r in STEP]


def test_with_the_v2_runner_the_model_states_flags_name_the_history_rows(monkeypatch, setup):
    _, vllm_config = setup
    monkeypatch.setattr(replay, "replay_gaps", lambda *args: [])
    monkeypatch.setattr(replay, "runs_v1_model_runner", lambda config: False)
    flags = [r.context > 0 and not r.prefilling for r in STEP]
    with applied([replay.builder_patch()]):
        assert not hasattr(build_metadata(vllm_config, V2_STEP, CPU), PLAN_ATTR)
        with step_past_prompt(flags):
            metadata = build_metadata(vllm_config, V2_STEP, CPU)
    assert getattr(metadata, PLAN_ATTR).rows == (3, 5, 6)


def test_v2_metadata_built_without_the_flags_is_not_replayed_and_says_so(
    monkeypatch, setup, caplog
):
    _, vllm_config = setup
    monkeypatch.setattr(replay, "replay_gaps", lambda *args: [])
    monkeypatch.setattr(replay, "runs_v1_model_runner", lambda config: False)
    with applied([replay.builder_patch()]), caplog.at_level(logging.WARNING):
        metadata = build_metadata(vllm_config, STEP, CPU)
    assert not hasattr(metadata, PLAN_ATTR)
    assert any(replay.V2_UNREPORTED_NOTE in r.getMessage() for r in caplog.records)


class FakeModelState:
    """The two methods of vLLM's ``MambaHybridModelState`` the V2 patches wrap."""

    def __init__(self):
        self.seen = []

    def add_request(self, req_index, new_req_data):
        pass

    def prepare_attn(self, input_batch, *args, **kwargs):
        self.seen.append(current_past_prompt())
        return "metadata"


def test_the_v2_model_state_records_prompts_and_flags_each_step():
    add = replay.make_add_request(FakeModelState.add_request)
    prepare = replay.make_prepare_attn(FakeModelState.prepare_attn)
    state = FakeModelState()
    new = types.SimpleNamespace
    add(state, 5, new(prompt_token_ids=[1] * 300, prompt_embeds=None))
    add(state, 2, new(prompt_token_ids=None, prompt_embeds=torch.zeros(40, 8)))
    batch = new(
        num_reqs=3,
        num_computed_tokens_np=np.array([300, 12, 41, 999]),
        idx_mapping_np=np.array([5, 2, 2, 7]),
    )
    assert prepare(state, batch, "more", key=1) == "metadata"
    assert state.seen == [[True, False, True]]
    assert current_past_prompt() is None  # only while vLLM prepares the step
    dummy = new(num_reqs=1, num_computed_tokens_np=np.array([0]), idx_mapping_np=np.array([9]))
    prepare(state, dummy)
    assert state.seen[-1] == [False]  # a slot without a recorded prompt: a dummy run


@pytest.mark.parametrize(
    "setting, mode, batch_invariant, reason",
    [
        (True, "route", True, None),
        (True, "golden", False, None),
        (True, "route", False, "needs VLLM_BATCH_INVARIANT=1 or mode golden"),
        (True, "off", True, "mode off"),
        (False, "golden", True, "VLLM_GDN_INVARIANT_REPLAY=off"),
    ],
)
def test_replay_off_reason(setting, mode, batch_invariant, reason):
    assert replay.replay_off_reason(setting, mode, batch_invariant) == reason


def test_replay_summary_names_gaps_or_caveats():
    assert replay.replay_summary([replay.SPECULATIVE_NOTE], []).startswith("off: speculative")
    text = replay.replay_summary([], [replay.KV_CONNECTOR_NOTE])
    assert text.startswith("on: ") and "KV connector" in text


def test_replay_gaps_name_speculative_decoding_and_in_chunk_checkpoints():
    config = dataclasses.make_dataclass("C", [("speculative_config", object)])
    assert replay.replay_gaps(config(None)) == []
    assert replay.replay_gaps(config(object())) == [replay.SPECULATIVE_NOTE]
    spec = dataclasses.make_dataclass("S", [("num_prefill_checkpoint_blocks", int)])
    assert replay.replay_gaps(config(None), spec(1)) == [replay.CHECKPOINT_NOTE]


def test_the_plan_lays_the_rows_tokens_out_row_after_row(setup):
    _, vllm_config = setup
    metadata = build_metadata(vllm_config, STEP, CPU)
    plan = history_plan(common_metadata(STEP, CPU), metadata)
    starts = token_ranges(STEP)
    expected = [starts[r] + t for r in (3, 5, 6) for t in range(STEP[r].query_len)]
    assert plan.sequence_order.tolist() == expected
    assert plan.cu_seqlens.tolist() == [0, 7, 12, 14]
    assert sorted(plan.sequence_order.tolist()) == sorted(plan.order.tolist())
