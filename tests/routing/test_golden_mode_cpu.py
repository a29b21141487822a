"""Mode golden on vLLM's CPU build: decode rows are the goldens' bits, in decode-only and
mixed steps; prefill rows are vLLM's own. vLLM's real CPU GDN function and kernels run."""

from __future__ import annotations

import importlib
import types

import pytest
import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from gdn_evidence.harness.layer import (
    LayerDims,
    build_metadata,
    make_layer,
    make_layer_state,
    make_vllm_config,
    step_inputs,
    step_requests,
)
from vllm_gdn_invariant.golden import conv_update, recurrent_step
from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.golden_decode import CPU_GDN_MODULE, golden_decode_patches
from vllm_gdn_invariant.shadow.bits import same_bits

from ..conftest import requires_ci_environment

pytestmark = requires_ci_environment

# vLLM's CPU kernels take head dims of 64 or 128.
DIMS = LayerDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def golden_mode():
    with applied(golden_decode_patches()):
        yield importlib.import_module(CPU_GDN_MODULE)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def setup(request):
    return request.param, make_vllm_config(DIMS, request.param, max_num_batched_tokens=512)


def cpu_layer(vllm_config, state):
    """A layer as vLLM's CPU build loads it: the conv weight packed for its C++ kernels where
    the CPU has them, the plain [dim, W] copy kept beside it."""
    from vllm import _custom_ops as ops

    layer = make_layer(vllm_config, DIMS, state, gqa_interleaved_layout=True)
    unpacked = state.conv_weight.view(DIMS.conv_dim, DIMS.conv_width).contiguous()
    module = importlib.import_module(CPU_GDN_MODULE)
    if torch.cpu._is_avx512_bf16_supported() or module.is_arm_bf16():
        conv1d = types.SimpleNamespace(
            weight=ops.causal_conv1d_weight_pack(unpacked.clone()),
            bias=None,
            _cpu_unpacked_conv_weight=unpacked,
        )
        object.__setattr__(layer, "conv1d", conv1d)
    return layer


def run(module, function, vllm_config, state, requests, inputs):
    state = state.clone()
    layer = cpu_layer(vllm_config, state)
    metadata = build_metadata(vllm_config, requests, CPU)
    out = torch.zeros(inputs[0].shape[0], DIMS.num_v_heads, DIMS.head_v_dim, dtype=torch.bfloat16)
    mixed_qkv, b, a = (t.clone() for t in inputs)
    getattr(module, function)(layer, metadata, mixed_qkv, b, a, out)
    return out, state


def golden_decode(state, inputs, blocks):
    """The goldens on the decode rows, on vLLM's CPU state memory ([HV, K, V] per block)."""
    mixed_qkv, b, a = inputs
    indices = torch.tensor(blocks, dtype=torch.int64)
    weight = state.conv_weight.view(DIMS.conv_dim, DIMS.conv_width)
    conv_out, new_conv = conv_update(
        mixed_qkv, state.conv_state, weight, indices, dim_first=is_conv_state_dim_first()
    )
    slots = state.ssm_state.shape[0]
    view = state.ssm_state.view(slots, DIMS.num_v_heads, DIMS.head_k_dim, DIMS.head_v_dim)
    out, new_state = recurrent_step(
        conv_out,
        a,
        b,
        state.A_log,
        state.dt_bias,
        view.transpose(-1, -2),
        indices,
        num_k_heads=DIMS.num_k_heads,
        scale=DIMS.head_k_dim**-0.5,
    )
    return out.squeeze(1), new_conv[indices], new_state[indices]


@pytest.mark.parametrize("decodes, prefills", [(3, []), (3, [9, 17]), (1, [40])])
def test_decode_rows_are_the_goldens_bits_alone_and_beside_prefills(
    golden_mode, setup, decodes, prefills
):
    state_dtype, vllm_config = setup
    g = torch.Generator().manual_seed(decodes + len(prefills))
    requests = step_requests(decodes, prefills, True)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    blocks = list(range(1, decodes + 1))
    want_out, want_conv, want_state = golden_decode(
        state, tuple(t[:decodes] for t in inputs), blocks
    )

    out, after = run(
        golden_mode, "_cpu_gdn_attention_nonspec", vllm_config, state, requests, inputs
    )
    slots = after.ssm_state.shape[0]
    cpu_view = after.ssm_state.view(slots, DIMS.num_v_heads, DIMS.head_k_dim, DIMS.head_v_dim)
    assert same_bits(out[:decodes], want_out)
    assert same_bits(after.conv_state[blocks], want_conv)
    assert same_bits(cpu_view.transpose(-1, -2)[blocks], want_state)

    upstream_out, upstream = run(
        golden_mode, "_cpu_gdn_attention_nonspec_upstream", vllm_config, state, requests, inputs
    )
    # Negative control: vLLM's own CPU decode kernel does not give the goldens' bits.
    assert not same_bits(upstream_out[:decodes], want_out)
    if prefills:  # prefill rows and states are vLLM's own
        tail = list(range(decodes + 1, len(requests) + 1))
        assert same_bits(out[decodes:], upstream_out[decodes:])
        assert same_bits(after.ssm_state[tail], upstream.ssm_state[tail])
        assert same_bits(after.conv_state[tail], upstream.conv_state[tail])
