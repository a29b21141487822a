"""docs/kernels.md's speed table and verdicts are what docs/evidence/bench_decode.json says."""

from __future__ import annotations

import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "bench_decode.json"
DOC = ROOT / "docs" / "kernels.md"
STATE = {"float32": "fp32", "bfloat16": "bf16"}


def cases() -> list[dict]:
    return json.loads(EVIDENCE.read_text())["cases"]


def flat_doc() -> str:
    return " ".join(DOC.read_text().split())


def round_ratios(case: dict, arm: str = "ours") -> list[float]:
    rounds = case["rounds_us"]
    return [v / o for v, o in zip(rounds["vllm"], rounds[arm], strict=True)]


def test_every_case_is_a_row_of_the_speed_table():
    doc = DOC.read_text()
    for c in cases():
        row = (
            f"| {c['op']} | {STATE[c['state_dtype']]} | {c['batch']} | {c['us']['vllm']} | "
            f"{c['us']['ours']} | {c['speed_vs_vllm']} | {c['fraction_of_copy']['vllm']} | "
            f"{c['fraction_of_copy']['ours']} |"
        )
        assert row in doc, row


def test_the_target_verdicts_are_the_rounds():
    large = [c for c in cases() if c["batch"] >= 64]
    conv_fp32 = [c for c in large if c["op"] == "conv" and c["state_dtype"] == "float32"]
    conv_bf16 = [c for c in large if c["op"] == "conv" and c["state_dtype"] == "bfloat16"]
    recurrent = [c for c in large if c["op"] == "recurrent"]
    assert all(min(round_ratios(c)) >= 1.0 for c in conv_fp32)  # met in every round
    assert all(min(round_ratios(c)) < 1.0 <= max(round_ratios(c)) for c in conv_bf16)
    assert all(max(round_ratios(c)) < 1.0 for c in recurrent)  # not met in any round
    lowest = min(min(round_ratios(c)) for c in conv_fp32)
    doc = flat_doc()
    assert f"(every round {math.floor(100 * lowest) / 100:.2f}x or more)" in doc
    medians = ", ".join(f"{c['speed_vs_vllm']:.3f}" for c in conv_bf16)
    assert f"at B = 64, 256 and 1024 (medians {medians})" in doc


def test_the_public_functions_speed_is_quoted():
    large = [c for c in cases() if c["batch"] >= 64]
    small = [c for c in cases() if c["batch"] < 64]

    def api(chosen: list[dict], op: str | None = None) -> list[float]:
        return [c["speed_vs_vllm_api"] for c in chosen if op is None or c["op"] == op]

    recurrent, conv = api(large, "recurrent"), api(large, "conv")
    doc = flat_doc()
    assert (
        f"at B >= 64, {min(recurrent):.2f}–{max(recurrent):.2f}x vLLM's kernels for "
        f"`recurrent_step` and {min(conv):.3f}–{max(conv):.2f}x for `conv_update`" in doc
    )
    assert f"; {min(api(small)):.3f}–{max(api(small)):.3f}x at B = 1 and 16)" in doc
