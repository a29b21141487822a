"""The shadow checker on vLLM's CPU path with vLLM's real CPU kernels, in mode route (vLLM's
kernels serve the decode rows) and with mode golden's patches (the goldens serve them)."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

from gdn_evidence.harness.layer import (
    build_metadata,
    make_layer_state,
    make_vllm_config,
    step_inputs,
    step_requests,
)
from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.golden_decode import CPU_GDN_MODULE, golden_decode_patches
from vllm_gdn_invariant.patches.shadow import shadow_patches
from vllm_gdn_invariant.shadow import checker as checker_module
from vllm_gdn_invariant.shadow import metrics
from vllm_gdn_invariant.shadow.bits import same_bits

from ..conftest import requires_ci_environment
from ..routing.test_golden_mode_cpu import DIMS, cpu_layer
from .helpers import make_checker, records

pytestmark = requires_ci_environment

CPU = torch.device("cpu")
FIELDS = ("output", "recurrent_state", "conv_state")


@pytest.fixture(params=["route", "golden"])
def mode(request, monkeypatch):
    monkeypatch.setattr(metrics, "setup_process", lambda: None)
    cpu_wrapper = shadow_patches()[1]
    patches = (golden_decode_patches() if request.param == "golden" else []) + [cpu_wrapper]
    with applied(patches):
        yield request.param
    checker_module.install(None)


def serve(state_dtype, decodes, prefills, seed=0):
    """One step through the CPU path's (wrapped) function; (out, state after)."""
    module = importlib.import_module(CPU_GDN_MODULE)
    vllm_config = make_vllm_config(DIMS, state_dtype, max_num_batched_tokens=512)
    g = torch.Generator().manual_seed(seed)
    requests = step_requests(decodes, prefills, True)
    state = make_layer_state(DIMS, state_dtype, len(requests) + 2, CPU, g)
    inputs = step_inputs(DIMS, sum(r.query_len for r in requests), CPU, g)
    layer = cpu_layer(vllm_config, state)
    metadata = build_metadata(vllm_config, requests, CPU)
    out = torch.zeros(inputs[0].shape[0], DIMS.num_v_heads, DIMS.head_v_dim, dtype=torch.bfloat16)
    step = object()  # the forward context of the step
    with mock.patch.object(module, "get_forward_context", return_value=step):
        module._cpu_gdn_attention_nonspec(layer, metadata, *(t.clone() for t in inputs), out)
    return out, state


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("decodes, prefills", [(3, []), (2, [9, 17])])
def test_golden_reference_sees_vllms_cpu_kernels_and_nothing_under_mode_golden(
    mode, tmp_path, state_dtype, decodes, prefills
):
    checker_module.install(None)
    with mock.patch.object(checker_module, "active_checker", return_value=None):
        want_out, want_state = serve(state_dtype, decodes, prefills)
    checker = make_checker(tmp_path, "1.0,ref=golden+decode", mode=mode)
    out, state = serve(state_dtype, decodes, prefills)
    assert same_bits(out, want_out) and same_bits(state.ssm_state, want_state.ssm_state)

    golden, decode = records(checker)
    assert (
        golden["provider"] == decode["provider"] == ("goldens" if mode == "golden" else "vllm-cpu")
    )
    assert golden["step_kind"] == ("mixed" if prefills else "decode")
    served_by_goldens, served_by_vllm = (golden, decode) if mode == "golden" else (decode, golden)
    assert all(served_by_goldens[name]["differing"] == 0 for name in FIELDS)
    # vLLM's CPU recurrent kernel is not the goldens' arithmetic; its conv update is
    assert served_by_vllm["recurrent_state"]["differing"] > 0
    assert served_by_vllm["output"]["differing"] > 0
    assert served_by_vllm["conv_state"]["differing"] == 0
