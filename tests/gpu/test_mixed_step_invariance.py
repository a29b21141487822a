"""GPU: decode rows of mixed steps through vLLM's real kernels, with the plugin installed.

Skipped without CUDA. scripts/mixed_step_invariance.py runs the full matrix and writes the
evidence JSON; this test pins a subset bitwise.
"""

from __future__ import annotations

import os

import pytest
import torch

from vllm_gdn_invariant.harness.layer import QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS, make_vllm_config
from vllm_gdn_invariant.harness.mixed_step import COMPOSITIONS, run_case
from vllm_gdn_invariant.plugin import entry

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CASE_COMPOSITIONS = 3


@pytest.fixture(scope="module")
def plugin():
    os.environ["VLLM_GDN_INVARIANT_STRICT"] = "1"
    entry.register()
    assert entry.registered_status().applied


@pytest.mark.parametrize("dims", [QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS], ids=["tp1", "tp4"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_rows_are_bitwise_equal_alone_and_in_mixed_steps(plugin, dims, state_dtype):
    vllm_config = make_vllm_config(dims, state_dtype)
    for composition in COMPOSITIONS[:CASE_COMPOSITIONS]:
        routed = run_case(
            vllm_config,
            dims,
            state_dtype,
            composition,
            gqa_interleaved_layout=True,
            device=torch.device("cuda"),
        )["routed"]
        for key in (
            "out_differ",
            "state_differ",
            "conv_differ",
            "following_out_differ",
            "prefill_out_differ_vs_unpatched",
            "prefill_state_differ_vs_unpatched",
            "prefill_conv_differ_vs_unpatched",
            "unwritten_out_rows",
        ):
            assert routed[key] == 0, (composition, key, routed)
