"""The default launch shapes are the H100 sweep's (docs/evidence/h200_engine/d990aaa/): at
Qwen3-Next's heads each is within a regression bound of the fastest shape timed in every swept
cell, and docs/kernels.md's sweep table is that file's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from vllm_gdn_invariant.kernels import conv, recurrent
from vllm_gdn_invariant.kernels.validation import ConvDims, RecurrentDims

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "docs" / "evidence" / "h200_engine" / "d990aaa" / "bench_decode_sweep.json"
DOC = ROOT / "docs" / "kernels.md"
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Regression bound: a default's time over the fastest swept shape's, measured at most 1.082
# (conv, bf16 cache, B = 16); the old defaults were up to 1.16x slower than the fastest.
WITHIN_FASTEST = 1.09


def default_shape(case: dict) -> dict:
    """The launch shape the package picks for a swept case, as the sweep records shapes."""
    batch = case["batch"]
    if case["op"] == "recurrent":
        dims = RecurrentDims(batch, 16, 32, 128, 128, 128**-0.5, True)
        state_dtype = STATE_DTYPES[case["state_dtype"]]
        return recurrent.recurrent_config(dims, state_dtype, interpreted=False).__dict__
    return conv.conv_config(ConvDims(batch, 8192, 4, True, True), interpreted=False).__dict__


def test_every_default_is_within_the_bound_of_the_fastest_swept_shape():
    cases = json.loads(SWEEP.read_text())["cases"]
    assert {c["batch"] for c in cases} == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
    ratios = {}
    for case in cases:
        times = [(r["config"], r["us"]) for r in case["sweep"]]
        mine = [us for config, us in times if config == default_shape(case)]
        assert len(mine) == 1, (case["op"], case["batch"], "the default was not swept")
        ratios[(case["op"], case["state_dtype"], case["batch"])] = mine[0] / min(
            us for _, us in times
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
