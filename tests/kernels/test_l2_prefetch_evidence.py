"""docs/kernels.md's section "The state asked into L2, commit 2046380" is what its evidence file
says: the loads-ahead variants timed beside vLLM and ours (docs/evidence/h200_engine/2046380/,
an H100)."""

from __future__ import annotations

import json
from pathlib import Path

from ..doc_blocks import marked_block

ROOT = Path(__file__).resolve().parents[2]
LOADS_AHEAD = (
    ROOT / "docs" / "evidence" / "h200_engine" / "2046380" / "bench_decode_loads_ahead.json"
)
DOC = ROOT / "docs" / "kernels.md"
L2_COLUMNS = ("l2_ahead_1", "l2_ahead_2", "early_l2_ahead_2", "l2_prefetch")
DEVICE = "speed_vs_vllm_device"


def flat_doc() -> str:
    return " ".join(DOC.read_text().split())


def report() -> dict:
    loaded = json.loads(LOADS_AHEAD.read_text())
    assert loaded["provenance"]["git_commit"][:7] == "2046380" and loaded["complete"]
    assert not loaded["provenance"]["git_dirty"]
    return loaded


def bf16_sets() -> dict[int, tuple[dict, dict]]:
    """B -> (the early-loads set's device-time ratios, the L2 set's) of the bf16 cases."""
    return {
        c["batch"]: (c["early_loads"][DEVICE], c["l2_prefetch"][DEVICE])
        for c in report()["cases"]
        if c["state_dtype"] == "bfloat16"
    }


def loads_ahead_table() -> str:
    rows = [
        "| B | ours | early loads | L2, 1 ahead | L2, 2 ahead | early + L2, 2 ahead | "
        "L2, whole range |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for batch, (early, l2) in bf16_sets().items():
        cells = [l2["ours"], early["early_loads"], *(l2.get(k) for k in L2_COLUMNS)]
        text = ["" if v is None else f"{v:.3f}" for v in cells]
        rows.append(f"| {batch} | " + " | ".join(text) + " |")
    return "\n".join(rows).replace(" |  |  |  |  |", " | | | | |")


def test_the_loads_ahead_table_is_its_evidence_file():
    assert marked_block(DOC.read_text(), "loads-ahead-table") == loads_ahead_table()


def test_the_loads_ahead_verdicts_are_the_runs():
    cases = report()["cases"]
    compared = [
        v for c in cases for s in ("early_loads", "l2_prefetch") for v in c[s]["same_bits"].values()
    ]
    assert all(compared)
    doc = flat_doc()
    assert f"bitwise ours ({len(compared)} comparisons)" in doc
    sets = bf16_sets()
    wide = {b: l2 for b, (_, l2) in sets.items() if b >= 64}
    one_ahead = [l2["l2_ahead_1"] for l2 in wide.values()]
    ours = [l2["ours"] for l2 in wide.values()]
    gains = [l2["l2_ahead_1"] - l2["ours"] for l2 in wide.values()]
    assert min(gains) > 0  # every B of the five
    assert (
        f"{min(one_ahead):.3f}–{max(one_ahead):.3f}x against ours' "
        f"{min(ours):.3f}–{max(ours):.3f}x, "
        f"{min(gains) * 100:.1f} to {max(gains) * 100:.1f} points at every B of the five" in doc
    )
    again = {b: abs(e["ours"] - l2["ours"]) for b, (e, l2) in sets.items()}
    assert round(max(v for b, v in again.items() if b != 32), 3) == 0.007 < again[32]
    assert f"within 0.007 of it except at B = 32, {sets[32][0]['ours']:.3f})" in doc
    two = [l2["l2_ahead_2"] for l2 in wide.values()]
    whole = [l2["l2_prefetch"] for l2 in wide.values()]
    assert f"({min(two):.3f}–{max(two):.3f}x)" in doc
    assert f"worse ({min(whole):.3f}–{max(whole):.3f}x)" in doc
    losses = [e["ours"] - e["early_loads"] for e, _ in sets.values()]
    assert min(losses) > 0  # every bf16 B
    assert (
        f"({min(losses) * 100:.1f} to {max(losses) * 100:.1f} points below ours in their set;"
        in doc
    )
    sixteen = next(c for c in cases if c["state_dtype"] == "bfloat16" and c["batch"] == 16)
    cold = sixteen["l2_prefetch"]["speed_vs_vllm_device_cold"]
    l2 = sixteen["l2_prefetch"][DEVICE]
    assert (
        f"the ratio was {l2['l2_ahead_1']:.3f} against ours' {l2['ours']:.3f}, and "
        f"{cold['l2_ahead_1']:.3f} against {cold['ours']:.3f} with L2 flushed" in doc
    )
