"""GPU: replay_response's CUDA path and prompt_state against their references (skipped without
CUDA).

* The CUDA path (one launch of the replay kernel) gives the goldens' bits at Qwen3-Next's TP1
  and TP4 per-rank dims with an 8192-token response among sequences of 1, 0 and 300 tokens,
  float32 and bfloat16 state: the reference is the goldens' path of the replay on the same CUDA
  tensors (the goldens' CUDA bits are their CPU bits: test_golden_device_bitwise.py).
* CUDA result == CPU result: replay_response on CUDA tensors and on their CPU copies.
* With ``cu_seqlens`` on the CPU, a CUDA call synchronizes nothing (torch's sync debug mode).
* prompt_state gives the bits of vLLM's own ``_forward_core`` on a prefill-only step of
  several prompts (fresh, and continuing from cached states), with the Triton prefill and a
  float32 state, as the plugin's batch-invariant mode runs it.
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
from vllm_gdn_invariant.replay import prompt_state, replay_response
from vllm_gdn_invariant.replay.checks import check_replay_args
from vllm_gdn_invariant.replay.golden_path import replay_with_goldens

from ..replay.helpers import BITWISE_EQUAL, build_case, differing_elements

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DIMS = {"tp1": QWEN3_NEXT_DIMS, "tp4": QWEN3_NEXT_TP4_DIMS}
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LONG_LENGTHS = [300, 8192, 1, 0]


def qwen_case(dims, lengths, state_dtype, seed=0, with_bias=False):
    case = build_case(
        lengths, H=dims.num_k_heads, HV=dims.num_v_heads, K=dims.head_k_dim,
        V=dims.head_v_dim, W=dims.conv_width, state_dtype=state_dtype, seed=seed,
        with_bias=with_bias,
    )  # fmt: skip
    return case


def to_cuda(case):
    moved = {n: t.cuda() for n, t in case.tensors().items() if n != "cu_seqlens"}
    return case.with_changes(**moved)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES.values(), ids=STATE_DTYPES.keys())
@pytest.mark.parametrize("dims", DIMS.values(), ids=DIMS.keys())
def test_the_cuda_path_gives_the_goldens_bits_over_8192_tokens(dims, state_dtype):
    case = to_cuda(qwen_case(dims, LONG_LENGTHS, state_dtype))
    result = replay_response(*case.args(), **case.all_kwargs())
    checked = check_replay_args(*case.args(), **case.all_kwargs())
    reference = replay_with_goldens(case.inputs(), checked)
    assert differing_elements(result, reference) == BITWISE_EQUAL


@pytest.mark.parametrize("state_dtype", STATE_DTYPES.values(), ids=STATE_DTYPES.keys())
def test_cuda_result_equals_cpu_result(state_dtype):
    case = qwen_case(QWEN3_NEXT_TP4_DIMS, [64, 1, 0, 17], state_dtype, seed=1, with_bias=True)
    cpu = replay_response(*case.args(), **case.all_kwargs())
    on_cuda = to_cuda(case)
    cuda = replay_response(*on_cuda.args(), **on_cuda.all_kwargs())
    assert differing_elements(tuple(t.cpu() for t in cuda), cpu) == BITWISE_EQUAL


def test_a_cuda_call_with_cpu_offsets_does_not_synchronize():
    case = to_cuda(qwen_case(QWEN3_NEXT_TP4_DIMS, [40, 3], torch.float32, seed=2))
    replay_response(*case.args(), **case.all_kwargs())  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        replay_response(*case.args(), **case.all_kwargs())
    finally:
        torch.cuda.set_sync_debug_mode("default")


def conv_blocks(layer_state, blocks):
    """The conv cache's blocks as [n, dim, W-1] (vLLM's layout, seen dim-first)."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    cache = layer_state.conv_state
    view = cache if qwen.is_conv_state_dim_first() else cache.transpose(-1, -2)
    return view[blocks].contiguous()


PROMPT_LENGTHS = [200, 64, 1000, 7]


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "continued"])
@pytest.mark.parametrize("dims", DIMS.values(), ids=DIMS.keys())
def test_prompt_state_gives_the_bits_of_vllms_prefill(dims, fresh):
    device = torch.device("cuda")
    vllm_config = make_vllm_config(dims, torch.float32, prefill_backend="triton")
    g = torch.Generator().manual_seed(3)
    layer_state = make_layer_state(dims, torch.float32, len(PROMPT_LENGTHS) + 1, device, g)
    initial = layer_state.clone()
    requests = step_requests(0, PROMPT_LENGTHS, fresh=fresh)
    metadata = build_metadata(vllm_config, requests, device)
    layer = make_layer(vllm_config, dims, layer_state, gqa_interleaved_layout=False)
    mixed_qkv, b, a = step_inputs(dims, sum(PROMPT_LENGTHS), device, g)
    served = run_core(layer, vllm_config, metadata, mixed_qkv, b, a)  # updates layer_state

    blocks = torch.arange(1, len(PROMPT_LENGTHS) + 1, device=device)
    cu_seqlens = torch.tensor([0, *torch.tensor(PROMPT_LENGTHS).cumsum(0).tolist()])
    states = {} if fresh else {
        "conv_state": conv_blocks(initial, blocks), "state": initial.ssm_state[blocks],
    }  # fmt: skip
    result = prompt_state(
        mixed_qkv, a, b, initial.A_log, initial.dt_bias, initial.conv_weight[:, 0], cu_seqlens,
        num_k_heads=dims.num_k_heads, head_k_dim=dims.head_k_dim, head_v_dim=dims.head_v_dim,
        conv_state_dtype=None if not fresh else layer_state.conv_state.dtype, **states,
    )  # fmt: skip
    reference = (served, conv_blocks(layer_state, blocks), layer_state.ssm_state[blocks])
    assert differing_elements(result, reference) == BITWISE_EQUAL
