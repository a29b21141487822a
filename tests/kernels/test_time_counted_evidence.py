"""docs/kernels.md, "Where the recurrent kernel's time goes, counted": its two tables are what the
scripts print from the committed evidence, and the numbers its prose quotes are theirs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..doc_blocks import marked_block, printed

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kernels.md"
CONTRACTED = ROOT / "docs/evidence/h200_engine/ee138de/bench_decode_contracted.json"
NCU = ROOT / "docs/evidence/h200_engine/1765652/ncu_recurrent.json"
REGISTERS = ROOT / "docs/evidence/h200_engine/641fd2c/bench_decode_registers.json"
PREFETCH = ROOT / "docs/evidence/h200_engine/3042e87/bench_decode_prefetch.json"
LOAD_ORDER = ROOT / "docs/evidence/sass_load_order_triton3.6.0.json"
REPLAY_STEP = ROOT / "docs/evidence/h200_engine/2a9f630/bench_decode_replay_step.json"
MORE_PROGRAMS = ROOT / "docs/evidence/h200_engine/2a9f630/bench_decode_sweep_more_programs.json"


@pytest.mark.parametrize(
    "script, flag, evidence, marker",
    [
        ("bench_decode.py", "--contracted-table", CONTRACTED, "contracted-table"),
        ("profile_recurrent.py", "--table", NCU, "ncu-table"),
        ("bench_decode.py", "--registers-table", REGISTERS, "registers-table"),
        ("bench_decode.py", "--prefetch-table", PREFETCH, "prefetch-table"),
        ("bench_decode.py", "--replay-step-table", REPLAY_STEP, "replay-step-table"),
    ],
    ids=["contracted", "ncu", "registers", "prefetch", "replay-step"],
)
def test_each_table_is_its_evidence_file(script, flag, evidence, marker):
    assert marked_block(DOC.read_text(), marker) == printed(script, flag, evidence)


def doc_text() -> str:
    return " ".join(DOC.read_text().split())


def test_the_contraction_gains_quoted_are_the_runs():
    cases = json.loads(CONTRACTED.read_text())["cases"]
    gains = {
        (c["state_dtype"], c["batch"]): c["contracted"]["speed_vs_vllm_device"]["contracted"]
        / c["contracted"]["speed_vs_vllm_device"]["ours"]
        - 1
        for c in cases
    }
    large = [g for (_, batch), g in gains.items() if batch >= 64]
    assert round(min(large) * 100, 1) == -0.1 and round(max(large) * 100, 1) == 0.5
    fp32 = [g for (dtype, batch), g in gains.items() if batch >= 64 and dtype == "float32"]
    assert round(max(fp32) * 100, 1) == 0.3
    small = [c["contracted"]["kernel_us"] for c in cases if c["batch"] < 64]
    assert max(abs(k["ours"] - k["contracted"]) for k in small) == pytest.approx(0.8, abs=0.05)
    text = doc_text()
    assert "moves the device time by -0.1 to +0.5 %" in text
    assert "fp32 at most +0.3 %" in text and "differ by up to 0.8 µs either way" in text


def test_the_dram_shares_quoted_are_the_counters():
    cases = {
        (c["state_dtype"], c["batch"]): c["kernels"] for c in json.loads(NCU.read_text())["cases"]
    }
    dram = "dram__throughput.avg.pct_of_peak_sustained_elapsed"

    def pair(arm: str, dtype: str) -> str:
        return f"{cases[(dtype, 128)][arm][dram]:.1f} / {cases[(dtype, 1024)][arm][dram]:.1f} %"

    text = doc_text()
    assert f"vLLM {pair('vllm', 'float32')} of peak with fp32" in text
    assert f"against ours' {pair('ours', 'float32')}" in text
    assert f"and {pair('vllm', 'bfloat16')} with bf16" in text
    assert f"against ours' {pair('ours', 'bfloat16')}" in text


def test_every_register_cap_was_slower_than_ptxas_own_choice():
    for case in json.loads(REGISTERS.read_text())["cases"]:
        device = case["registers"]["speed_vs_vllm_device"]
        assert all(device[name] < device["ours"] for name in device if "maxnreg" in name)


def arithmetic_after_the_last_load(order: str) -> int:
    """fp32 ops between the loop's last load and its state stores (the first SSSS)."""
    loop = order[: order.index("SSSS")]
    tail = loop[loop.rindex("L") + 1 :]
    return sum(int(n) if n else 1 for n in re.findall(r"f(\d*)", tail))


def test_the_load_placement_quoted_is_the_compiled_code():
    cases = {c["maxnreg"]: c for c in json.loads(LOAD_ORDER.read_text())["cases"]}
    default, capped = cases[None], cases[168]
    loop_ptx = default["ptx"].rsplit("LLLLL", 1)[1]
    assert loop_ptx.startswith("f") and "S" in loop_ptx  # PTX: loads, then arithmetic, stores
    assert arithmetic_after_the_last_load(default["sass"]) < 5  # SASS: loads by the stores
    assert arithmetic_after_the_last_load(capped["sass"]) > 100  # capped: before most of it
    assert (default["registers"], capped["registers"], cases[255]["registers"]) == (128, 154, 154)
    text = doc_text()
    assert "keeping the kernel at 128 registers" in text and "it takes 154" in text


def test_loads_two_blocks_ahead_kept_the_bits_and_were_slower_from_64_rows():
    cases = json.loads(PREFETCH.read_text())["cases"]
    assert all(all(c["prefetch"]["same_bits"].values()) for c in cases)
    large = [c for c in cases if c["batch"] >= 64]
    assert all(
        c["prefetch"]["speed_vs_vllm_device"][name] < c["prefetch"]["speed_vs_vllm_device"]["ours"]
        for c in large
        for name in c["prefetch"]["speed_vs_vllm_device"]
        if name.startswith("prefetch")
    )
    bf16 = [c["prefetch"]["speed_vs_vllm_device"] for c in large if c["state_dtype"] == "bfloat16"]
    two = f"{min(d['prefetch_two'] for d in bf16):.3f}–{max(d['prefetch_two'] for d in bf16):.3f}"
    ours = f"{min(d['ours'] for d in bf16):.3f}–{max(d['ours'] for d in bf16):.3f}"
    assert f"bf16 default {two}x against ours' {ours}x" in doc_text()


def test_no_program_shape_beat_the_default_and_one_warp_of_32_rows_was_slower():
    report = json.loads(MORE_PROGRAMS.read_text())
    assert report["provenance"]["git_commit"] == "2a9f630" and report["provenance"]["git_dirty"]
    cases = {(c["state_dtype"], c["batch"]): c["sweep"] for c in report["cases"]}
    assert sorted(batch for _, batch in cases) == [128, 128, 512, 512, 1024, 1024]
    for batch in (128, 512, 1024):  # rows sorted by time: the bf16 default is the fastest
        assert cases[("bfloat16", batch)][0]["default"]
    text = doc_text()
    for batch in (512, 1024):
        fastest, default = (
            cases[("float32", batch)][0],
            next(r for r in cases[("float32", batch)] if r["default"]),
        )
        assert fastest["config"] == {
            "block_v": 8, "log2_j": 0, "log2_cl": 5, "log2_vec": 2, "num_warps": 1, "chunks": 1
        }  # fmt: skip
        assert f"{fastest['us']:.2f} against" in text and f"{default['us']:.2f}" in text
        assert f"{fastest['speed_vs_vllm']:.3f}x vLLM against" in text
    bf16 = {tuple(r["config"].values()): r for r in cases[("bfloat16", 128)]}
    one_warp = bf16[(32, 2, 2, 3, 1, 1)]  # block_v, log2_j, log2_cl, log2_vec, warps, chunks
    four_warps = bf16[(32, 2, 2, 3, 4, 4)]
    default = cases[("bfloat16", 128)][0]
    assert f"timed {len(bf16) - 1} other shapes beside the default" in text
    assert (
        f"the one-warp 32-row program is {one_warp['speed_vs_vllm']:.3f}x vLLM at B = 128 "
        f"(default {default['speed_vs_vllm']:.3f}x)" in text
    )
    assert f"ties the default ({four_warps['us']:.2f} against {default['us']:.2f} µs)" in text


def test_the_replay_kernel_as_a_decode_step_kept_the_bits_and_was_slower():
    report = json.loads(REPLAY_STEP.read_text())
    assert report["provenance"]["git_commit"] == "2a9f630" and not report["provenance"]["git_dirty"]
    steps = [c["replay_step"] for c in report["cases"]]
    assert len(steps) == 22 and all(s["same_bits"] == {"replay_one_token": True} for s in steps)
    assert all(s["kernel_us"]["replay_one_token"] > s["kernel_us"]["ours"] for s in steps)
    assert all(s["kernel_us"]["replay_one_token"] > s["kernel_us"]["vllm"] for s in steps)

    def span(dtype: str) -> str:
        ratios = [
            c["replay_step"]["speed_vs_vllm_device"]["replay_one_token"]
            for c in report["cases"]
            if c["state_dtype"] == dtype
        ]
        return f"{min(ratios):.3f}–{max(ratios):.3f}x"

    assert (
        f"Slower than both everywhere (bf16 {span('bfloat16')} vLLM, fp32 {span('float32')})"
        in doc_text()
    )


def test_the_loops_barriers_quoted_are_the_output_stores():
    """Per block, the bf16 default's loop has two barriers, between the state's four vector
    stores and the output's store; the prologue's barriers come before the loop's loads."""
    default = next(c for c in json.loads(LOAD_ORDER.read_text())["cases"] if c["maxnreg"] is None)
    prologue, loop = default["ptx"].rsplit("LLLLLf", 1)
    assert loop.count("B") == 2 and re.search(r"SSSSBBS\|", loop)
    assert "B" in prologue
    assert "two `bar.sync` between the state's stores and the output's (`SSSSBBS`" in doc_text()
