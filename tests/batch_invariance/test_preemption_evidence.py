"""docs/preemption.md against docs/evidence/preemption.json: the table is the JSON's, and the
JSON holds what the doc claims (every replayed request bitwise its uninterrupted run, every
control differing, enough natural preemptions, every model, setting and mode)."""

from __future__ import annotations

import json
from pathlib import Path

from gdn_evidence.e2e.preemption import results_table

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "preemption.json"
DOC = ROOT / "docs" / "preemption.md"
MIN_NATURAL_PREEMPTIONS = 5


def records():
    return json.loads(EVIDENCE.read_text())["cases"]


def test_the_docs_table_is_the_evidence_files():
    text = DOC.read_text()
    table = text.split("<!-- preemption-table -->\n", 1)[1].split("\n<!-- /preemption-table -->")[0]
    assert table == results_table(records())


def test_every_replayed_request_is_its_uninterrupted_run_and_no_engine_failed():
    cases = records()
    assert not [c for c in cases if "error" in c]
    replay = [c for c in cases if c["arm"] == "replay"]
    assert replay and all(c["identical"] == c["compared"] for c in replay)
    assert all(c["first_divergence"] == [None] * c["compared"] for c in replay)


def test_the_controls_differ():
    cases = records()
    forced = [c for c in cases if c["arm"] == "control" and c["kind"] == "forced"]
    assert forced and all(c["identical"] == 0 for c in forced)
    natural = [c for c in cases if c["arm"] == "control" and c["kind"] == "natural"]
    assert natural and all(c["identical"] < c["compared"] for c in natural)


def test_natural_cases_preempt_enough_and_cover_every_engine():
    cases = records()
    natural = [c for c in cases if c["kind"] == "natural"]
    assert all(c["preemptions"] >= MIN_NATURAL_PREEMPTIONS for c in natural)
    engines = {(c["model"], c["cuda_graphs"], c["mode"]) for c in cases}
    models = {"qwen3_next", "qwen3_5", "qwen3_next_dims"}
    assert engines >= {
        (m, g, mode) for m in models for g in (False, True) for mode in ("route", "golden")
    }


def test_the_cost_section_quotes_the_longest_replay_of_the_table():
    longest = max(c["replay_seconds"] for c in records())
    assert f"it took up to {longest:.2f} s per run" in " ".join(DOC.read_text().split())
