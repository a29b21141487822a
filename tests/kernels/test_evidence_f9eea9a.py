"""docs/kernels.md quotes the H100 runs of 2026-12-07 as their evidence files say: the outputs
stored as held (docs/evidence/h200_engine/b4eb0d3/, branch ``as-held``), mode golden in the
engine (f9eea9a/: stage ``golden-long`` and ``golden-profile``) and the recurrent step on the
engine's own tensors (b37226a/ in mode golden, e566172/ in mode route)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ..doc_blocks import marked_block, printed
from ..evidence_cases import clean_report, span
from .test_evidence_docs import DOC, ROOT, flat_doc

RUNS = ROOT / "docs" / "evidence" / "h200_engine"
OUTPUT_STORE = RUNS / "b4eb0d3" / "bench_decode_output_store.json"
GOLDEN_LONG = RUNS / "f9eea9a" / "bench_engine_golden_long.json"
GOLDEN_PROFILE = RUNS / "f9eea9a" / "bench_engine_golden_profile.json"
LAYOUTS = {
    "golden": RUNS / "b37226a" / "engine_decode_layout.json",
    "route": RUNS / "e566172" / "engine_decode_layout_route.json",
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_output_store_table_is_its_evidence_file():
    clean_report(OUTPUT_STORE, "b4eb0d3")
    table = printed("bench_decode.py", "--output-store-table", OUTPUT_STORE)
    assert marked_block(DOC.read_text(), "output-store-table-b4eb0d3") == table


def test_the_verdict_is_the_geometric_mean_over_the_cases():
    cases = clean_report(OUTPUT_STORE, "b4eb0d3")["cases"]
    ratios = []
    for case in cases:
        speeds = case["output_store"]["speed_vs_vllm_device"]
        other = speeds.get("through_shared", speeds["without_l2_ahead"])
        ratios.append(speeds["ours"] / other)
    assert all(all(c["output_store"]["same_bits"].values()) for c in cases)
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    log = (RUNS / "b4eb0d3" / "output_store_verdict.log").read_text()
    assert f"{mean:.4f}" in log and "verdict: through shared memory" in log
    doc = flat_doc()
    assert f"across the {len(cases)} cases is **{mean:.4f}**" in doc
    large = [c for c in cases if c["state_dtype"] == "bfloat16" and c["batch"] >= 128]
    held = [c["output_store"]["speed_vs_vllm_device"]["ours"] for c in large]
    shared = [c["output_store"]["speed_vs_vllm_device"]["through_shared"] for c in large]
    assert f"({span(held)}x against {span(shared)}x)" in doc


def test_the_a6f0c3c_call_failed_to_compile_the_store():
    log = (RUNS / "a6f0c3c" / "bench_decode_output_store.log").read_text()
    message = "invalid operands of type pointer<bf16> and triton.language.bfloat16"
    assert message in log and message in flat_doc()


def test_golden_long_is_quoted():
    summary = load(GOLDEN_LONG)["summary"]
    throughput = summary["ratio_spread"]["golden"]["decode_throughput_vs_route"]
    itl = summary["ratio_spread"]["golden"]["itl_vs_route"]
    rounds = summary["round_ratios"]["golden"]["decode_throughput_vs_route"]
    doc = flat_doc()
    assert (
        f"throughput round ratios {span(rounds)} (**spread {throughput['spread'] * 100:.2f} %**, "
        f"median {throughput['median']:.4f}), ratio of the median throughputs "
        f"**{summary['ratios']['golden']['decode_throughput_vs_route']:.4f}**" in doc
    )
    assert f"(ratio {summary['ratios']['golden']['itl_vs_route']:.4f})" in doc
    assert f"(spread {itl['spread'] * 100:.2f} %)" in doc
    assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] == "inconclusive"


def test_golden_profile_is_quoted():
    profile = load(GOLDEN_PROFILE)["profile"]
    by_round = profile["vs_route"]["golden"]["device_time_ratio_rounds"]
    doc = flat_doc()
    assert f"**{by_round[0]:.4f}, {by_round[1]:.4f} and {by_round[2]:.4f}**" in doc
    categories = {arm: profile["arms"][arm]["categories_us"] for arm in ("route", "golden")}
    decode = [categories[arm]["gdn_decode"] / 1e3 for arm in ("golden", "route")]
    assert f"({decode[0]:.2f} against {decode[1]:.2f} ms, {decode[1] / decode[0]:.3f}x)" in doc


@pytest.mark.parametrize("mode", ["golden", "route"])
def test_the_engine_layout_table_is_quoted(mode):
    record = load(LAYOUTS[mode])
    assert record["provenance"]["git_dirty"] is False
    result = record["result"]
    assert result.get("mode", "golden") == mode  # b37226a's script ran mode golden only
    assert result["layouts"]["engine"]["l2_ahead"]
    assert result["layouts"]["engine"]["stride"][0] == 557056
    arms = result["arms"]
    engine, compact = arms["engine"], arms["compact"]
    row = (
        f"| mode {mode} | {engine['vllm_us']:.2f} / {engine['ours_us']:.2f} µs = "
        f"{engine['vllm_over_ours']:.3f} | {arms['engine_sorted']['vllm_over_ours']:.3f} | "
        f"{compact['vllm_us']:.2f} / {compact['ours_us']:.2f} µs = "
        f"{compact['vllm_over_ours']:.3f} |"
    )
    assert row in DOC.read_text()
