"""docs/kernels.md, "The state asked into L2 in the package, commit 344febd", quotes the run at
344febd (docs/evidence/h200_engine/344febd/, an H100) as its evidence files say: stage
``kernels`` (the GPU matrix and bench_decode.json) and stage ``loads-ahead``, whose
``without_l2_ahead`` arm is the package's kernel without its request into L2."""

from __future__ import annotations

import functools
import json

from ..doc_blocks import marked_block, printed
from ..evidence_cases import cells, clean_report, span
from .test_evidence_docs import (
    AT_4356317,
    DOC,
    LATEST,
    LATEST_RUN,
    assert_stage_kernels_run_quoted,
    device_span,
    flat_doc,
)

LOADS_AHEAD = LATEST_RUN / "bench_decode_loads_ahead.json"
DEVICE = "speed_vs_vllm_device"
COLD = "speed_vs_vllm_device_cold"


@functools.cache
def report() -> dict:
    return clean_report(LOADS_AHEAD, "344febd")


def l2_set(state: str, key: str = DEVICE) -> dict[int, dict[str, float]]:
    """B -> the L2 set's ratios (vLLM/variant) of ``state``'s cases."""
    return {
        c["batch"]: c["l2_prefetch"][key] for c in report()["cases"] if c["state_dtype"] == state
    }


def test_the_stage_kernels_run_is_quoted():
    cases = assert_stage_kernels_run_quoted(LATEST_RUN, "344febd", passed=175)
    doc = flat_doc()
    assert "the 175 cases of" in doc
    assert (
        "passed in 198 s" in doc and "in 198.23s" in (LATEST_RUN / "pytest_kernels.log").read_text()
    )
    before = json.loads(AT_4356317.read_text())["cases"]
    now, then = (device_span(c, "recurrent", "bfloat16", 64, fmt=".3f") for c in (cases, before))
    assert f"the 7-round stage `kernels` gives {now[:-1]}x where 4356317's gave {then[:-1]}x" in doc
    fp32_then = device_span(before, "recurrent", "float32", 64, fmt=".3f")
    fp32_now = device_span(cases, "recurrent", "float32", 64, fmt=".3f")
    assert f"moved from {fp32_then} (4356317) to {fp32_now} at B >= 64 between two H100s" in doc
    bf16 = [c[DEVICE] for c in cells(cases, "recurrent", "bfloat16", 64)]
    assert max(bf16) < 1
    small = [c[DEVICE] for c in cells(cases, "recurrent", "bfloat16", 1, 16)]
    assert (
        f"the recurrent step from B = 64 by {(1 - max(bf16)) * 100:.1f} to "
        f"{(1 - min(bf16)) * 100:.1f} points, and below B = 32 ({span(small)}x," in doc
    )


def test_the_l2_ahead_table_is_its_evidence_file():
    table = printed("bench_decode.py", "--l2-prefetch-table", LOADS_AHEAD)
    assert marked_block(DOC.read_text(), "l2-ahead-table-344febd") == table


def test_every_variant_had_ours_bits():
    compared = [
        same
        for c in report()["cases"]
        for variants in ("early_loads", "l2_prefetch")
        for same in c[variants]["same_bits"].values()
    ]
    assert all(compared) and f"bitwise ours ({len(compared)} comparisons)" in flat_doc()


def test_the_request_wins_with_bf16_from_b_64_and_moves_nothing_with_fp32():
    doc = flat_doc()
    wide = {b: r for b, r in l2_set("bfloat16").items() if b >= 64}
    gains = [r["ours"] - r["without_l2_ahead"] for r in wide.values()]
    assert min(gains) > 0  # every B of the five
    assert (
        f"ours {span([r['ours'] for r in wide.values()])}x against "
        f"{span([r['without_l2_ahead'] for r in wide.values()])}x without it, "
        f"{min(gains) * 100:.1f} to {max(gains) * 100:.1f} points, most where the grid is "
        f"smallest (B = 64)" in doc
    )
    assert max(gains) == gains[list(wide).index(64)]
    fp32 = {b: r for b, r in l2_set("float32").items() if b >= 32}
    apart = max(abs(r["ours"] - r["without_l2_ahead"]) for r in fp32.values())
    assert round(apart, 3) == 0.004 and "within 0.004 of each other from B = 32 up" in doc
    w1c8, w1c16 = ([r[s] for b, r in fp32.items() if b >= 64] for s in ("w1c8", "w1c16"))
    assert max(w1c8 + w1c16) < min(r["ours"] for r in fp32.values())
    assert f"fp32 runs at {span(w1c8)}x and {span(w1c16)}x from B = 64" in doc


def test_the_request_is_on_where_the_default_shapes_take_two_blocks():
    """bf16 from B = 16, never fp32, as the section says."""
    chunks = {
        (c["state_dtype"], c["batch"]): c["config"]["chunks"]
        for c in json.loads(LATEST.read_text())["cases"]
        if c["op"] == "recurrent"
    }
    assert {cell for cell, n in chunks.items() if n >= 2} == {
        (state, b) for state, b in chunks if state == "bfloat16" and b >= 16
    }
    assert "(the bf16 default shapes from B = 16; the fp32 ones take one block)" in flat_doc()


def test_b_16_and_32_are_quoted_back_to_back_and_flushed():
    warm, cold = l2_set("bfloat16"), l2_set("bfloat16", COLD)
    assert (
        f"back to back ours ran {warm[16]['ours']:.3f}x and {warm[32]['ours']:.3f}x against "
        f"{warm[16]['without_l2_ahead']:.3f}x and {warm[32]['without_l2_ahead']:.3f}x without "
        f"the request, with L2 flushed {cold[16]['ours']:.3f}x and {cold[32]['ours']:.3f}x "
        f"against {cold[16]['without_l2_ahead']:.3f}x and {cold[32]['without_l2_ahead']:.3f}x"
        in flat_doc()
    )
    # The two orders disagree at both B: the round decides nothing there.
    for batch in (16, 32):
        assert (warm[batch]["ours"] < warm[batch]["without_l2_ahead"]) != (
            cold[batch]["ours"] < cold[batch]["without_l2_ahead"]
        )
