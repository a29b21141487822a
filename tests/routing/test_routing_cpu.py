"""The routed ``_forward_core`` on CPU, with vLLM's real metadata builder and real method.

vLLM's GDN kernels are replaced by the stand-ins of ``standins.py`` (goldens for the
decode-only pair, a float64 recurrence for the mixed-step decode kernel), so the tests can
tell which path a row took: decode rows of a mixed step must get the bits of a decode-only
step, which upstream's mixed path does not give them.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch

from gdn_evidence.harness.layer import (
    LayerDims,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
    step_requests,
)
from vllm_gdn_invariant.patches import routed_forward_core as routing
from vllm_gdn_invariant.patches import routing_patch
from vllm_gdn_invariant.shadow.bits import same_bits

from . import standins

DIMS = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)
CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("standin_kernels")  # tests/conftest.py
COMPOSITIONS = [  # (decode rows, prefill lengths, fresh prefills)
    (1, [5], True),
    (3, [9, 17], False),
    (4, [1, 12], True),
    (2, [20, 3, 8], False),
]


@pytest.fixture(scope="module")
def routed():
    patch = routing_patch()
    patch.apply()
    yield patch
    patch.revert()


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def setup(request):
    state_dtype = request.param
    return state_dtype, make_vllm_config(
        DIMS, state_dtype, max_num_seqs=32, max_num_batched_tokens=512
    )


def new_layer(vllm_config, state):
    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    object.__setattr__(layer, "chunk_gated_delta_rule", standins.chunk_gated_delta_rule)
    return layer


def run(vllm_config, state, requests, inputs, method="_forward_core", blocks=None):
    """Run one step on a copy of ``state``; return (out, state after)."""
    state = state.clone()
    layer = new_layer(vllm_config, state)
    metadata = build_metadata(vllm_config, requests, CPU, blocks)
    out = run_core(layer, vllm_config, metadata, *inputs, method=method)
    return out, state


def slice_inputs(inputs, rows):
    return tuple(t[rows] for t in inputs)


@pytest.mark.parametrize("decodes, prefills, fresh", COMPOSITIONS)
def test_decode_rows_of_a_mixed_step_get_the_decode_only_bits(
    routed, setup, decodes, prefills, fresh
):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(decodes * 100 + sum(prefills))
    requests = step_requests(decodes, prefills, fresh)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    decodes = build_metadata(vllm_config, requests, CPU).num_decodes  # the builder's count
    decode_blocks = slice(1, decodes + 1)

    alone_out, alone = run(
        vllm_config, state, requests[:decodes], slice_inputs(inputs, slice(0, decodes))
    )
    mixed_out, mixed = run(vllm_config, state, requests, inputs)
    upstream_out, upstream = run(
        vllm_config, state, requests, inputs, method="_forward_core_upstream"
    )

    assert same_bits(mixed_out[:decodes], alone_out)
    assert same_bits(mixed.ssm_state[decode_blocks], alone.ssm_state[decode_blocks])
    assert same_bits(mixed.conv_state[decode_blocks], alone.conv_state[decode_blocks])
    if state_dtype == torch.float32:
        # Negative control: vLLM's own mixed path rounds these rows differently (in a bf16
        # state the stand-ins' fp32-level difference rarely survives the store).
        assert not same_bits(upstream.ssm_state[decode_blocks], alone.ssm_state[decode_blocks])


@pytest.mark.parametrize("decodes, prefills, fresh", COMPOSITIONS)
def test_prefill_rows_of_a_mixed_step_get_the_prefill_only_bits(
    routed, setup, decodes, prefills, fresh
):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(7 + decodes)
    requests = step_requests(decodes, prefills, fresh)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    num_tokens = sum(r.query_len for r in requests)
    # The builder's count: vLLM before 0.32 counts a fresh one-token prompt as a decode row.
    decodes = build_metadata(vllm_config, requests, CPU).num_decodes
    prefill_blocks = slice(decodes + 1, len(requests) + 1)

    mixed_out, mixed = run(vllm_config, state, requests, inputs)
    upstream_out, upstream = run(
        vllm_config, state, requests, inputs, method="_forward_core_upstream"
    )
    alone_out, alone = run(
        vllm_config,
        state,
        requests[decodes:],
        slice_inputs(inputs, slice(decodes, num_tokens)),
        blocks=range(decodes + 1, len(requests) + 1),
    )

    assert not mixed_out.isnan().any(), "every row of core_attn_out must be written"
    for other_out, other in ((alone_out, alone), (upstream_out[decodes:], upstream)):
        assert same_bits(mixed_out[decodes:], other_out)
        assert same_bits(mixed.ssm_state[prefill_blocks], other.ssm_state[prefill_blocks])
        assert same_bits(mixed.conv_state[prefill_blocks], other.conv_state[prefill_blocks])
    # Blocks no request owns are untouched.
    assert same_bits(mixed.ssm_state[0], state.ssm_state[0])
    assert same_bits(mixed.ssm_state[-1], state.ssm_state[-1])


def spy_upstream(layer):
    calls = []
    original = layer._forward_core_upstream

    def record(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    object.__setattr__(layer, "_forward_core_upstream", record)
    return calls


@pytest.mark.parametrize(
    "requests",
    [step_requests(3, [], True), step_requests(0, [7, 2], True)],
    ids=["decode-only", "prefill-only"],
)
def test_steps_without_both_kinds_go_to_upstream_untouched(routed, setup, requests):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(3)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    layer = new_layer(vllm_config, state)
    calls = spy_upstream(layer)
    metadata = build_metadata(vllm_config, requests, CPU)
    with mock.patch.object(routing, "gdn_invariant_split_mixed_step") as split:
        run_core(layer, vllm_config, metadata, *inputs)
    split.assert_not_called()
    (call,) = calls
    assert call["mixed_qkv"].shape[0] == inputs[0].shape[0]
    assert same_bits(call["mixed_qkv"], inputs[0])


def test_spec_steps_go_to_upstream_untouched(routed, setup):
    _, vllm_config = setup
    requests = step_requests(2, [6], True)
    metadata = build_metadata(vllm_config, requests, CPU)
    spec = dataclasses.replace(metadata, spec_sequence_masks=torch.tensor([True, False, False]))
    layer = new_layer(
        vllm_config, make_layer_state(DIMS, torch.float32, 5, CPU, torch.Generator().manual_seed(0))
    )
    assert routing.gdn_invariant_routes(layer, metadata)
    assert not routing.gdn_invariant_routes(layer, spec)
    # Decode rows of more than one token (num_decode_tokens != num_decodes) stay vLLM's.
    multi_token = dataclasses.replace(metadata, num_decode_tokens=metadata.num_decodes + 1)
    assert not routing.gdn_invariant_routes(layer, multi_token)
    object.__setattr__(layer, "enable_packed_recurrent_decode", False)
    assert not routing.gdn_invariant_routes(layer, metadata)


def test_rebased_conv_programs_equal_vllms_own_tables_for_the_tail():
    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    lens = [1, 1, 1, 9, 17, 3, 40]
    decodes = 3
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    full = compute_causal_conv1d_metadata(qsl, device=CPU)
    tail_qsl = qsl[decodes:] - qsl[decodes]
    expected, expected_ptr, expected_offsets = compute_causal_conv1d_metadata(tail_qsl, device=CPU)
    rebased, ptr, offsets = routing.gdn_invariant_rebase_conv_programs(*full, decodes)
    for key in ("nums", "mlist", "offsetlist"):
        assert rebased[8][key].tolist() == expected[8][key].tolist()
    assert rebased[8]["tot"] == expected[8]["tot"]
    assert rebased[8]["mlist_len"] == expected[8]["mlist_len"]
    tot = expected[8]["tot"]
    assert rebased[8]["batch_ptr"][:tot].tolist() == expected[8]["batch_ptr"][:tot].tolist()
    assert ptr[:tot].tolist() == expected_ptr[:tot].tolist()
    assert offsets[:tot].tolist() == expected_offsets[:tot].tolist()
