"""The default launch shapes are the H100 sweep's (docs/evidence/h200_engine/d990aaa/): at
Qwen3-Next's heads each is within a regression bound of the fastest shape timed in every swept
cell, and docs/kernels.md's sweep table is that file's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gdn_evidence.harness.launch_shapes import default_sweep_row

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "docs" / "evidence" / "h200_engine" / "d990aaa" / "bench_decode_sweep.json"
DOC = ROOT / "docs" / "kernels.md"
# Regression bound: a default's time over the fastest swept shape's, measured at most 1.082
# (conv, bf16 cache, B = 16); the old defaults were up to 1.16x slower than the fastest.
WITHIN_FASTEST = 1.09


def test_every_default_is_within_the_bound_of_the_fastest_swept_shape():
    cases = json.loads(SWEEP.read_text())["cases"]
    assert {c["batch"] for c in cases} == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
    ratios = {}
    for case in cases:
        fastest = min(r["us"] for r in case["sweep"])
        ratios[(case["op"], case["state_dtype"], case["batch"])] = (
            default_sweep_row(case)["us"] / fastest
        )
    assert max(ratios.values()) <= WITHIN_FASTEST, max(ratios.items(), key=lambda kv: kv[1])


def test_the_docs_sweep_table_is_the_evidence_file():
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_decode.py"), "--sweep-table", str(SWEEP)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()
    block = DOC.read_text().split("<!-- sweep-table -->\n", 1)[1].split("\n<!-- /sweep-table -->")
    assert block[0] == table


def spans() -> dict[str, str]:
    """The ranges docs/kernels.md quotes from the sweep: vLLM's time over the default shape's
    (now, and at d990aaa), per op, state dtype and batch range."""
    cases = json.loads(SWEEP.read_text())["cases"]

    def span(op: str, state: str, low: int, earlier: bool = False) -> str:
        values = [
            next(r for r in c["sweep"] if r["default"]) if earlier else default_sweep_row(c)
            for c in cases
            if (c["op"], c["state_dtype"]) == (op, state) and c["batch"] >= low
        ]
        ratios = [r["speed_vs_vllm"] for r in values]
        return f"{min(ratios):.2f}–{max(ratios):.2f}"

    return {
        "bf16": span("recurrent", "bfloat16", 32),
        "bf16_earlier": span("recurrent", "bfloat16", 32, earlier=True),
        "fp32_from_128": span("recurrent", "float32", 128),
        "conv_bf16": span("conv", "bfloat16", 64),
        "conv_fp32": span("conv", "float32", 1),
    }


def test_the_docs_quote_the_sweep():
    s = spans()
    assert s["fp32_from_128"] == "0.99–0.99"
    doc = " ".join(DOC.read_text().split())
    assert (
        f"* Recurrent, bf16 state: {s['bf16']}x at B >= 32 (the earlier default "
        f"{s['bf16_earlier']}x)" in doc
    )
    assert "* Recurrent, fp32 state: 0.99x from B = 128 up" in doc
    assert f"* Conv: {s['conv_fp32'].split('–')[0]}x and more with an fp32 cache" in doc
    assert f"with bf16 {s['conv_bf16']}x from B = 64 up" in doc


def test_every_default_is_a_shape_the_gpu_bitwise_test_checked():
    """The sweep's GPU test (``launch_shapes_of_the_sweep``, passed in the same call) checks
    every shape timed at B = 64 but that run's own default; every default now, at every batch
    size, is one of them."""
    cases = json.loads(SWEEP.read_text())["cases"]
    checked = {
        (c["op"], c["state_dtype"]): [r["config"] for r in c["sweep"] if not r["default"]]
        for c in cases
        if c["batch"] == 64
    }
    log = (SWEEP.parent / "pytest_sweep_shapes.log").read_text()
    assert "6 passed" in log and "failed" not in log
    for case in cases:
        row = default_sweep_row(case)
        assert not row["default"], (case["op"], case["batch"])
        assert row["config"] in checked[(case["op"], case["state_dtype"])]
