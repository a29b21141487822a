"""docs/shadow.md's engine table is what the committed shadow engine reports say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "evidence" / "h200_engine" / "d2f6948"
DOC = ROOT / "docs" / "shadow.md"
FIELDS = ("output", "recurrent_state", "conv_state")


def report_rows() -> dict[tuple[str, str, str, str], str]:
    rows = {}
    for mode in ("route", "golden"):
        report = json.loads((RUN / f"shadow_engine_{mode}_0.26.0.json").read_text())
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
        if len(cells) == 7 and cells[0] in ("route", "golden") and cells[4].isdigit():
            rows[tuple(cells[:4])] = " | ".join(cells[4:])
    return rows


def test_the_engine_table_is_the_reports():
    assert doc_rows() == report_rows()


def test_mode_golden_shows_no_difference_against_the_goldens():
    for key, row in report_rows().items():
        if key[0] == "golden" and key[1] == "golden":
            assert row.split(" | ")[1:] == ["0 / 0 / 0", "0 / 0 / 0"], key
