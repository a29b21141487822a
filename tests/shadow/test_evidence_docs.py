"""docs/shadow.md's engine table is what the committed shadow engine reports say."""

from __future__ import annotations

import json
from pathlib import Path

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
