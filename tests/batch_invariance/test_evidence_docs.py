"""docs/batch-invariance.md's end-to-end table is what docs/evidence/e2e_determinism.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "e2e_determinism.json"
DOC = ROOT / "docs" / "batch-invariance.md"
MODEL_NAMES = {"qwen3_next": "Qwen3-Next", "qwen3_5": "Qwen3.5"}


def cases() -> list[dict]:
    return json.loads(EVIDENCE.read_text())["cases"]


def first_differing(a: list, b: list) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def outcome(case: dict) -> str:
    """The table's words for a case's result."""
    if case["refused"]:
        return f'refused: "{case["refused"]}"'
    if case["tokens_identical"] and case["logprobs_identical"]:
        return "tokens and logprobs identical"
    logprobs = first_differing(case["logprob_bits_alone"], case["logprob_bits_batched"])
    if case["tokens_identical"]:
        return f"tokens identical, logprobs differ from {logprobs}"
    tokens = first_differing(case["tokens_alone"], case["tokens_batched"])
    return f"tokens differ from {tokens}, logprobs from {logprobs}"


def table_rows() -> dict[tuple[str, int, str], str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in MODEL_NAMES.values() and cells[1][:1].isdigit():
            rows[(cells[0], int(cells[1].split()[0]), cells[2])] = cells[3]
    return rows


def test_every_case_of_the_evidence_is_a_row_of_the_table_with_its_outcome():
    rows = table_rows()
    assert len(rows) == len(cases())
    for case in cases():
        key = (MODEL_NAMES[case["model"]], case["arm"], case["setting"])
        assert rows[key] == outcome(case), key


@pytest.mark.parametrize("model", list(MODEL_NAMES))
def test_arm_four_is_bitwise_identical_and_arm_five_differs_in_both_settings(model):
    by_arm = {(c["arm"], c["setting"]): c for c in cases() if c["model"] == model}
    for setting in ("eager", "default"):
        four, five = by_arm[(4, setting)], by_arm[(5, setting)]
        assert four["refused"] is None and four["tokens_identical"] and four["logprobs_identical"]
        assert five["refused"] is None and not five["logprobs_identical"]
        assert four["distinct_tokens_alone"] > 8  # greedy tokens vary: a difference can show


def test_every_run_was_a_clean_tree_on_the_gpu():
    runs = json.loads(EVIDENCE.read_text())["provenance"]["runs"]
    assert runs and all(r["git_dirty"] is False and r["device"] == "NVIDIA H200" for r in runs)
