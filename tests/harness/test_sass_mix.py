"""scripts/sass_mix.py's counting on the CPU: vLLM's kernel read from a release source compiles
for sm_90, the counts tell contraction on from off, the launcher's SM90 tile is read from the
source, and docs/kernels.md's table is docs/evidence/sass_mix.json's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gdn_evidence.harness.sass_mix import (
    VLLM_KERNEL,
    compile_ours,
    compile_vllm,
    installed_vllm_source,
    mix,
    table,
    vllm_block_v,
    vllm_kernel,
)

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "sass_mix.json"
DOC = ROOT / "docs" / "kernels.md"
LAUNCHER = """
def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, initial_state):
    BV = min(triton.next_power_of_2(V), 32)
{branch}
    num_warps = 1
"""
SM90_BRANCH = """    elif (
        K == V == 128
        and initial_state.dtype == torch.float32
        and current_platform.is_device_capability(90, device_id=dev.index)
    ):
        BV = 4"""


def test_vllms_kernel_compiles_from_its_source_and_counts_per_state_element():
    arm = compile_vllm(installed_vllm_source(), torch.bfloat16, batch=64, capability=90)
    counted = mix(arm)
    assert counted["state_elements_per_thread"] == 32 * 128 // 32
    assert counted["instructions"] == sum(counted["classes"].values())
    assert counted["instructions_per_element"] == pytest.approx(
        counted["instructions"] / counted["state_elements_per_thread"], abs=1e-3
    )
    assert counted["top_opcodes"]["FFMA"] > 0  # vLLM compiles with contraction on


def test_the_counts_tell_contraction_on_from_off():
    golden = mix(compile_ours(torch.bfloat16, 64, 90, fusion=False))
    contracted = mix(compile_ours(torch.bfloat16, 64, 90, fusion=True))
    assert contracted["top_opcodes"]["FFMA"] > golden["top_opcodes"].get("FFMA", 0)
    assert contracted["per_element"]["fp32_arithmetic"] < golden["per_element"]["fp32_arithmetic"]


def test_the_launchers_sm90_fp32_tile_is_read_from_the_source(tmp_path):
    with_branch = tmp_path / "with_branch.py"
    with_branch.write_text(LAUNCHER.format(branch=SM90_BRANCH))
    without = tmp_path / "without.py"
    without.write_text(LAUNCHER.format(branch=""))
    assert vllm_block_v(with_branch, torch.float32, 90) == 4
    assert vllm_block_v(with_branch, torch.bfloat16, 90) == 32
    assert vllm_block_v(with_branch, torch.float32, 100) == 32
    assert vllm_block_v(without, torch.float32, 90) == 32


def test_a_source_without_the_kernel_is_refused(tmp_path):
    source = tmp_path / "fused_recurrent.py"
    source.write_text("def something_else():\n    pass\n")
    with pytest.raises(ValueError, match=VLLM_KERNEL):
        vllm_kernel(source)


def test_the_docs_table_is_the_evidence_files():
    after = DOC.read_text().split("<!-- sass-mix-table -->\n", 1)[1]
    documented = after.split("\n<!-- /sass-mix-table -->")[0]
    assert documented == table(json.loads(EVIDENCE.read_text())["cases"])
