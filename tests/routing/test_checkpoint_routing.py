"""Routed mixed steps with FlashInfer prefill and ``mamba_cache_mode="align"`` checkpoints.

vLLM 0.33+ attaches prefill checkpoint rows and FlashInfer's checkpoint plan to a mixed step
whose prefills cross a prefix-cache block. The routed prefill tail must read them as the
builder lays them out for a prefill-only step of the tail, and export the same checkpoint
states as vLLM's own mixed step. vLLM's real builder, ``_forward_core``,
``_forward_flashinfer_prefill``/``fi_chunk_gated_delta_rule`` and checkpoint exporter run;
FlashInfer's kernel, the exporter's Triton kernel and the other GDN kernels are CPU stand-ins.
Skipped on releases without FlashInfer checkpoint plans (before 0.33).
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen
from vllm.v1.attention.backends import gdn_attn

from gdn_evidence.harness.layer import (
    LayerDims,
    Request,
    align_block_table,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    run_core,
    step_inputs,
)
from vllm_gdn_invariant.patches import routed_forward_core as routing
from vllm_gdn_invariant.patches import routing_patch
from vllm_gdn_invariant.shadow.bits import same_bits

from . import standins

pytestmark = pytest.mark.skipif(
    not hasattr(gdn_attn, "GDNFlashInferCheckpointPlan"),
    reason="this vLLM release has no FlashInfer prefill checkpoints (0.33+)",
)

DIMS = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)
CPU = torch.device("cpu")
BLOCK = 64  # mamba block = hash block = cache-hit alignment = FlashInfer's checkpoint grid
DECODE = Request(1, 63, False)
# (decode rows, prefills): fresh prompts of 200 and 130 tokens and a chunk of 150 after 64
# hold a checkpoint (at 192, 128 and 192); 37 tokens do not.
COMPOSITIONS = {
    "2d+fresh": (2, [Request(200, 0, True), Request(37, 0, True), Request(130, 0, True)]),
    "3d+continued": (3, [Request(150, 64, True), Request(1, 0, True), Request(200, 0, True)]),
}


@pytest.fixture(scope="module")
def routed():
    patch = routing_patch()
    patch.apply()
    yield patch
    patch.revert()


class Workspace:
    """vLLM's workspace manager (CUDA only): buffers filled with NaN, so a checkpoint slot the
    prefill did not write cannot pass for a written one."""

    def get_simultaneous(self, *shapes_and_dtypes):
        return [torch.full(shape, float("nan"), dtype=dtype) for shape, dtype in shapes_and_dtypes]


@pytest.fixture(autouse=True)
def flashinfer_standins(standin_kernels, monkeypatch):
    monkeypatch.setattr(qwen, "current_workspace_manager", Workspace)
    monkeypatch.setattr(
        qwen, "_resolve_gdn_prefill_backend", lambda vllm_config: ("flashinfer", "flashinfer")
    )
    gdn_prefill = types.ModuleType("flashinfer.gdn_prefill")
    gdn_prefill.chunk_gated_delta_rule = standins.flashinfer_chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", gdn_prefill)
    checkpoint_module = sys.modules[type(qwen.MambaPrefillCheckpointExporter()).__module__]
    monkeypatch.setattr(
        checkpoint_module, "store_cache_checkpoints_kernel", standins.StoreCacheCheckpointsKernel()
    )


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def setup(request):
    state_dtype = request.param
    config = make_vllm_config(
        DIMS,
        state_dtype,
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        prefill_backend="flashinfer",
        align_block_size=BLOCK,
    )
    return state_dtype, config


def metadata(vllm_config, requests, rows):
    return build_metadata(vllm_config, requests, CPU, rows, prefill_backend="flashinfer")


def flashinfer_layer(vllm_config, state):
    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    # vLLM's prefill dispatch (ChunkGatedDeltaRule.forward_cuda) with FlashInfer selected.
    accepted = (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "initial_state",
        "output_final_state",
        "cu_seqlens",
        "use_qk_l2norm_in_kernel",
    )
    object.__setattr__(
        layer,
        "chunk_gated_delta_rule",
        lambda **kw: qwen.fi_chunk_gated_delta_rule(**{k: kw[k] for k in accepted if k in kw}),
    )
    assert layer.gdn_prefill_backend == "flashinfer"
    return layer


def run(vllm_config, state, requests, rows, inputs, method="_forward_core"):
    state = state.clone()
    layer = flashinfer_layer(vllm_config, state)
    out = run_core(
        layer, vllm_config, metadata(vllm_config, requests, rows), *inputs, method=method
    )
    return out, state


def composition(name):
    decodes, prefills = COMPOSITIONS[name]
    requests = [DECODE] * decodes + prefills
    rows = align_block_table(requests, BLOCK)
    return decodes, requests, rows


def checkpoint_fields(meta) -> dict:
    cp, plan = meta.checkpoint, meta.flashinfer_checkpoint_plan
    fields = {f.name: getattr(cp, f.name) for f in dataclasses.fields(cp)}
    fields.update({f"plan.{f.name}": getattr(plan, f.name) for f in dataclasses.fields(plan)})
    return fields


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_rebased_checkpoints_equal_the_builders_for_a_prefill_only_step_of_the_tail(setup, name):
    _, vllm_config = setup
    decodes, requests, rows = composition(name)
    mixed = metadata(vllm_config, requests, rows)
    tail = metadata(vllm_config, requests[decodes:], rows[decodes:])
    assert mixed.num_decodes == decodes and mixed.flashinfer_checkpoint_plan is not None
    assert tail.num_decodes == 0
    _, prefill_view = routing.gdn_invariant_build_split(mixed)
    got, want = checkpoint_fields(prefill_view), checkpoint_fields(tail)
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert torch.equal(got[key].cpu(), want[key].cpu()), key  # integer tables
        else:
            assert got[key] == want[key], key
    # Without the rebase the tables would not match (the fixture tells the cases apart).
    assert checkpoint_fields(mixed)["plan.rows"].numel() != want["plan.rows"].numel()


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_routed_step_exports_vllms_checkpoints_and_decode_rows_get_decode_only_bits(
    routed, setup, name
):
    state_dtype, vllm_config = setup
    decodes, requests, rows = composition(name)
    g = torch.Generator().manual_seed(len(requests))
    num_blocks = 1 + len(rows) * len(rows[0])
    state = make_layer_state(DIMS, state_dtype, num_blocks, CPU, g)
    num_tokens = sum(r.query_len for r in requests)
    inputs = step_inputs(DIMS, num_tokens, CPU, g)
    mixed_meta = metadata(vllm_config, requests, rows)
    cp = mixed_meta.checkpoint
    checkpoint_blocks = cp.state_indices[cp.checkpoint_offsets > 0].long()
    state_blocks = mixed_meta.non_spec_state_indices_tensor.long()
    assert checkpoint_blocks.numel() == 2

    routed_out, routed_state = run(vllm_config, state, requests, rows, inputs)
    upstream_out, upstream_state = run(
        vllm_config, state, requests, rows, inputs, method="_forward_core_upstream"
    )
    tail = slice(decodes, num_tokens)
    tail_out, tail_state = run(
        vllm_config,
        state,
        requests[decodes:],
        rows[decodes:],
        tuple(t[tail] for t in inputs),
    )
    decode_out, decode_state = run(
        vllm_config,
        state,
        requests[:decodes],
        rows[:decodes],
        tuple(t[:decodes] for t in inputs),
    )

    dec, pre = state_blocks[:decodes], state_blocks[decodes:]
    assert same_bits(routed_out[:decodes], decode_out)
    assert same_bits(routed_state.ssm_state[dec], decode_state.ssm_state[dec])
    assert same_bits(routed_state.conv_state[dec], decode_state.conv_state[dec])
    for other_out, other in ((upstream_out[decodes:], upstream_state), (tail_out, tail_state)):
        assert same_bits(routed_out[decodes:], other_out)
        for blocks in (pre, checkpoint_blocks):
            assert same_bits(routed_state.ssm_state[blocks], other.ssm_state[blocks])
            assert same_bits(routed_state.conv_state[blocks], other.conv_state[blocks])
    # The checkpoints were written (not left as they were).
    assert not same_bits(
        routed_state.ssm_state[checkpoint_blocks], state.ssm_state[checkpoint_blocks]
    )
    # Every block nobody owns is untouched.
    owned = torch.cat([state_blocks, checkpoint_blocks])
    free = torch.ones(num_blocks, dtype=torch.bool)
    free[owned] = False
    assert same_bits(routed_state.ssm_state[free], state.ssm_state[free])
    assert same_bits(routed_state.conv_state[free], state.conv_state[free])


def test_an_unrebased_plan_exports_the_wrong_checkpoints(routed, setup, monkeypatch):
    """Negative control: the step above fails when the plan's rows are not rebased."""
    state_dtype, vllm_config = setup
    decodes, requests, rows = composition("2d+fresh")
    g = torch.Generator().manual_seed(5)
    state = make_layer_state(DIMS, state_dtype, 1 + len(rows) * len(rows[0]), CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    cp = metadata(vllm_config, requests, rows).checkpoint
    checkpoint_blocks = cp.state_indices[cp.checkpoint_offsets > 0].long()
    _, upstream = run(vllm_config, state, requests, rows, inputs, method="_forward_core_upstream")
    monkeypatch.setattr(routing, "gdn_invariant_rebase_flashinfer_plan", lambda plan, n: plan)
    try:
        _, routed_state = run(vllm_config, state, requests, rows, inputs)
    except AssertionError:  # 0.34's exporter checks one plan row per checkpoint row
        return
    assert not same_bits(
        routed_state.ssm_state[checkpoint_blocks], upstream.ssm_state[checkpoint_blocks]
    )
