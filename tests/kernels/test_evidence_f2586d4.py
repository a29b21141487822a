"""docs/kernels.md quotes the run of branch whole-blocks-index at f2586d4
(docs/evidence/h200_engine/f2586d4/, an H100) as its evidence files say: section "Whole blocks'
rows from the block index"."""

from __future__ import annotations

import functools
import json

from ..doc_blocks import marked_block
from .test_evidence_docs import DOC, ROOT, flat_doc

RUN = ROOT / "docs" / "evidence" / "h200_engine" / "f2586d4"
ARMS = ("pointer_loop", "ours", "in_order")  # main's loop, the branch's, the control


@functools.cache
def report() -> dict:
    return json.loads((RUN / "bench_decode_block_loop.json").read_text())


def bf16_cases() -> list[dict]:
    return [c for c in report()["cases"] if c["state_dtype"] == "bfloat16"]


def table() -> str:
    rows = [
        "| B | vLLM (µs, device) | pointer loop (main) | index loop (branch) | control | "
        "pointer loop, cold | index loop, cold | control, cold |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case in bf16_cases():
        timed = case["block_order"]
        ratios = [timed["speed_vs_vllm_device"][arm] for arm in ARMS]
        ratios += [timed["speed_vs_vllm_device_cold"][arm] for arm in ARMS]
        cells = " | ".join(f"{r:.3f}" for r in ratios)
        rows.append(f"| {case['batch']} | {case['kernel_us']['vllm']:.2f} | {cells} |")
    return "\n".join(rows)


def test_the_run_is_the_branchs_on_an_h100():
    provenance = report()["provenance"]
    assert provenance["git_commit"][:7] == "f2586d4" and not provenance["git_dirty"]
    assert "H100" in provenance["device"] and report()["complete"]
    assert report()["settings"]["flush"] == "read"


def test_the_block_loop_table_is_its_evidence_file():
    assert marked_block(DOC.read_text(), "block-loop-table") == table()


def test_the_verdict_is_the_runs():
    compared = [v for c in report()["cases"] for v in c["block_order"]["same_bits"].values()]
    assert all(compared)
    doc = flat_doc()
    assert f"bitwise the branch kernel's in all {len(compared)} comparisons" in doc
    wide = [c["block_order"] for c in bf16_cases() if c["batch"] >= 64]

    def gains(kind: str) -> list[float]:
        return [100 * (t[kind]["ours"] - t[kind]["pointer_loop"]) for t in wide]

    device, cold = gains("speed_vs_vllm_device"), gains("speed_vs_vllm_device_cold")
    assert (
        f"From B = 64 the index loop is {min(device):+.1f} to {max(device):+.1f} points from the "
        f"pointer loop by device time and {min(cold):+.1f} to {max(cold):+.1f} with L2 flushed: "
        f"at most {max(device + cold):.1f} % of the kernel's time" in doc
    )
    passed = (RUN / "pytest_recurrent.log").read_text().count(".")
    assert f"passed the {passed} recurrent cases of `tests/gpu/test_kernels_bitwise.py`" in doc
    assert "F" not in (RUN / "pytest_recurrent.log").read_text()
