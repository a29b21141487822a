"""scripts/sass_mix.py's counting on the CPU: vLLM's kernel read from a release source compiles
for sm_90, the counts tell contraction on from off, the launcher's SM90 tile is read from the
source, and docs/kernels.md's table is docs/evidence/sass_mix.json's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gdn_evidence.harness.launch_shapes import recurrent_candidates
from gdn_evidence.harness.sass_mix import (
    VLLM_KERNEL,
    compile_chunked,
    compile_ours,
    compile_vllm,
    dims_for,
    installed_vllm_source,
    loop_bodies,
    mix,
    table,
    vllm_block_v,
    vllm_kernel,
)
from vllm_gdn_invariant.kernels import codegen, recurrent

from ..doc_blocks import marked_block

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
    documented = marked_block(DOC.read_text(), "sass-mix-table")
    assert documented == table(json.loads(EVIDENCE.read_text())["cases"])


def test_the_blocks_paragraph_quotes_the_counts():
    """docs/kernels.md's "Blocks of value rows per program" is what both sass_mix files say."""

    def by_arm(path: Path, state: str, batch: int) -> dict[str, dict]:
        cases = json.loads(path.read_text())["cases"]
        return {c["arm"]: c for c in cases if (c["state"], c["batch"]) == (state, batch)}

    doc = " ".join(DOC.read_text().split())
    small, large = by_arm(EVIDENCE, "bf16", 1), by_arm(EVIDENCE, "bf16", 64)
    n_small, n_large = small["ours"]["instructions"], large["ours"]["instructions"]
    e_small = small["ours"]["state_elements_per_thread"]
    e_large = large["ours"]["state_elements_per_thread"]
    per_element = (n_large - n_small) / (e_large - e_small)
    per_program = n_small - e_small * per_element
    assert (e_small, e_large) == (32, 128)
    assert (
        f"at B = 1 and 64 (32 and 128 state elements per thread) issue {n_small} and {n_large} "
        f"instructions per thread, about {per_program:.0f} per program and {per_element:.2f} per "
        f"element. At 128 elements per thread the per-program share is "
        f"{per_program / e_large:.1f} per element, at {large['ours']['registers']} registers, "
        f"and only {large['ours']['resident_warps_per_sm']} warps fit an SM" in doc
    )
    fp32 = by_arm(EVIDENCE, "fp32", 64)
    chunked, vllm = large["ours_chunked"], large["vllm"]
    assert (
        f"issues {chunked['instructions_per_element']:.2f} instructions per element with a bf16 "
        f"state (ours at the default shape {large['ours']['instructions_per_element']:.2f}, vLLM "
        f"0.34.0's {vllm['instructions_per_element']:.2f}) at {chunked['registers']} registers, "
        f"{chunked['resident_warps_per_sm']} warps per SM "
        f"({large['ours']['resident_warps_per_sm']} at the default shape, "
        f"{vllm['resident_warps_per_sm']} for vLLM's); with an fp32 state "
        f"{fp32['ours_chunked']['instructions_per_element']:.2f} (default "
        f"{fp32['ours']['instructions_per_element']:.2f}) at {fp32['ours_chunked']['registers']} "
        f"registers, {fp32['ours_chunked']['resident_warps_per_sm']} warps per SM" in doc
    )
    t36 = ROOT / "docs" / "evidence" / "sass_mix_triton3.6.0.json"
    b36, f36 = by_arm(t36, "bf16", 64), by_arm(t36, "fp32", 64)

    def ipe(arms: dict, arm: str) -> str:
        return f"{arms[arm]['instructions_per_element']:.2f}"

    assert (
        f"bf16 {ipe(b36, 'ours_chunked')} against vLLM's {ipe(b36, 'vllm')} and ours' "
        f"{ipe(b36, 'ours')}, fp32 {ipe(f36, 'ours_chunked')} against vLLM's {ipe(f36, 'vllm')} "
        f"and ours' {ipe(f36, 'ours')}" in doc
    )
    assert chunked["spills"] is False and fp32["ours_chunked"]["spills"] is False


def test_a_loop_runs_once_per_block_in_the_count():
    """The chunked arm's count is the straight-line count plus the loop's body once more per
    block after the first; an arm without blocks has no loop."""
    chunked = compile_chunked(torch.bfloat16, 64, 90)
    sass = codegen.sass_of(chunked.compiled.asm["cubin"])
    ((start, end),) = loop_bodies(sass, chunked.kernel_name)
    static = len(codegen.sass_functions(sass)[chunked.kernel_name])
    assert mix(chunked)["instructions"] == static + (chunked.chunks - 1) * (end - start)
    plain = compile_ours(torch.float32, 64, 90, fusion=False)
    assert plain.chunks == 1
    assert loop_bodies(codegen.sass_of(plain.compiled.asm["cubin"]), plain.kernel_name) == []


def test_the_candidate_counts_are_the_sweeps_shapes_and_are_quoted():
    """docs/evidence/sass_mix_candidates_triton3.6.0.json counts the shapes launch_shapes.py
    gives now (the defaults among them), and docs/kernels.md quotes it."""
    path = ROOT / "docs" / "evidence" / "sass_mix_candidates_triton3.6.0.json"
    counted = json.loads(path.read_text())["cases"]
    dims = dims_for(64)
    for state, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        default = recurrent.recurrent_config(dims, dtype, interpreted=False)
        shapes = [default, *recurrent_candidates(dims, dtype)]
        assert [c["config"] for c in counted if c["state"] == state] == [s.__dict__ for s in shapes]
    assert all(c["contraction_clean"] and not c["spills"] for c in counted)
    assert sum(c["default"] for c in counted) == 2

    def fewest(state: str, registers: int = 255) -> dict:
        return min(
            (c for c in counted if c["state"] == state and c["registers"] <= registers),
            key=lambda c: c["instructions_per_element"],
        )

    def quoted(c: dict) -> str:
        return (
            f"{c['instructions_per_element']:.2f} ({c['config']['block_v']} x "
            f"{c['config']['chunks']}, {c['registers']} registers, "
            f"{c['resident_warps_per_sm']} warps per SM)"
        )

    best, best_at_128 = fewest("bf16"), fewest("bf16", registers=128)
    doc = " ".join(DOC.read_text().split())
    assert f"all {len(counted)} (the two defaults among them) compile without spills" in doc
    assert (
        f"bf16 {best['instructions_per_element']:.2f} (blocks of {best['config']['block_v']} "
        f"rows, {best['config']['chunks']} per program, {best['registers']} registers, "
        f"{best['resident_warps_per_sm']} warps per SM) and {quoted(best_at_128)}, "
        f"fp32 {quoted(fewest('fp32'))}" in doc
    )
