"""GPU: decode rows of mixed steps through vLLM's real kernels, with the plugin installed.

Skipped without CUDA. scripts/mixed_step_invariance.py runs the full matrix and writes the
evidence JSON; this test pins a subset bitwise.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gdn_evidence.harness.layer import QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS, make_vllm_config
from gdn_evidence.harness.mixed_step import COMPOSITIONS, run_case
from vllm_gdn_invariant.patches import apply_all
from vllm_gdn_invariant.plugin import entry
from vllm_gdn_invariant.plugin.config import PluginConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CASE_COMPOSITIONS = 3


PREFILL_SETUPS = [
    pytest.param("triton", None, id="triton"),
    pytest.param(
        "flashinfer",
        64,
        id="flashinfer-align",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("flashinfer") is None, reason="needs FlashInfer"
        ),
    ),
]


@pytest.fixture(scope="module")
def plugin():
    """The plugin's patches, checked as in strict mode, applied for this module and reverted."""
    status = entry.plan(PluginConfig(strict=True))
    assert status.refusal is None, status.refusal
    apply_all(status.patches)
    yield status
    for patch in reversed(status.patches):
        patch.revert()


@pytest.mark.parametrize("backend, align", PREFILL_SETUPS)
@pytest.mark.parametrize("dims", [QWEN3_NEXT_DIMS, QWEN3_NEXT_TP4_DIMS], ids=["tp1", "tp4"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_rows_are_bitwise_equal_alone_and_in_mixed_steps(
    plugin, dims, state_dtype, backend, align
):
    vllm_config = make_vllm_config(
        dims, state_dtype, prefill_backend=backend, align_block_size=align
    )
    for composition in COMPOSITIONS[:CASE_COMPOSITIONS]:
        routed = run_case(
            vllm_config,
            dims,
            state_dtype,
            composition,
            gqa_interleaved_layout=True,
            device=torch.device("cuda"),
            prefill_backend=backend,
        )["routed"]
        for key in (
            "out_differ",
            "state_differ",
            "conv_differ",
            "following_out_differ",
            "prefill_out_differ_vs_unpatched",
            "prefill_state_differ_vs_unpatched",
            "prefill_conv_differ_vs_unpatched",
            "prefill_checkpoint_differ_vs_unpatched",
            "unwritten_out_rows",
        ):
            assert routed[key] == 0, (composition, key, routed)
