"""docs/shadow.md's engine table is what the committed shadow engine reports say."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_gdn_invariant.shadow.checker import MAX_IN_FLIGHT

ROOT = Path(__file__).resolve().parents[2]
ENGINE_RUNS = ROOT / "docs" / "evidence" / "h200_engine"
RUNS = {"route": "d2f6948", "golden": "d2f6948", "off": "e08a754"}  # mode -> commit of its run
DOC = ROOT / "docs" / "shadow.md"
FIELDS = ("output", "recurrent_state", "conv_state")


def report_rows() -> dict[tuple[str, str, str, str], str]:
    rows = {}
    for mode, commit in RUNS.items():
        path = ENGINE_RUNS / commit / f"shadow_engine_{mode}_0.26.0.json"
        report = json.loads(path.read_text())
        assert not report["arms"][mode]["failures"]
        for g in report["arms"][mode]["groups"]:
            differing = " / ".join(str(g["checks_with_difference"][f]) for f in FIELDS)
            ulp = " / ".join(str(g["max_ulp"][f]) for f in FIELDS)
            key = (mode, g["reference"], g["provider"], g["step_kind"])
            rows[key] = f"{g['checks']} | {differing} | {ulp}"
    return rows


def doc_rows() -> dict[tuple[str, str, str, str], str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in RUNS and cells[4].isdigit():
            rows[tuple(cells[:4])] = " | ".join(cells[4:])
    return rows


def test_the_engine_table_is_the_reports():
    assert doc_rows() == report_rows()


def test_mode_golden_shows_no_difference_against_the_goldens():
    for key, row in report_rows().items():
        if key[0] == "golden" and key[1] == "golden":
            assert row.split(" | ")[1:] == ["0 / 0 / 0", "0 / 0 / 0"], key


def test_mode_off_shows_the_mixed_path_against_the_decode_kernels():
    rows = report_rows()
    mixed = rows[("off", "decode", "vllm-mixed", "mixed")].split(" | ")
    assert mixed[1].startswith(f"{mixed[0]} / {mixed[0]} / "), mixed  # every mixed check
    decode_only = rows[("off", "decode", "vllm-packed-decode", "decode")].split(" | ")
    assert decode_only[1:] == ["0 / 0 / 0", "0 / 0 / 0"], decode_only


def flat_doc() -> str:
    return " ".join(DOC.read_text().split())


def test_the_overhead_at_1_64_is_within_the_target_in_every_round_as_the_doc_says():
    report = json.loads((ENGINE_RUNS / "922abb7" / "bench_shadow_engine_0.26.0.json").read_text())
    (engine,) = [r for r in report["results"] if r["level"] == "engine"]
    p, rounds = engine["checked_step_probability_at_1/64"], engine["rounds_us"]
    derived = [100 * p * (a / o - 1) for a, o in zip(rounds["1"], rounds["off"], strict=True)]
    measured = [a / o for a, o in zip(rounds["1/64"], rounds["off"], strict=True)]
    assert max(derived) < 2.0  # the target, in every round
    doc = flat_doc()
    assert f"it is {min(derived):.1f}–{max(derived):.1f} %." in doc
    assert f"and {min(measured):.2f}–{max(measured):.2f}x off round by round" in doc


def test_the_doc_says_when_the_serving_thread_waits():
    doc = flat_doc()
    assert "never waits" not in doc
    assert f"when a check is submitted while {MAX_IN_FLIGHT} are in flight" in doc
    assert f"at most {MAX_IN_FLIGHT} are in flight" in doc
