"""docs/preemption.md against docs/evidence/preemption.json: the table is the JSON's, and the
JSON holds what the doc claims (every replayed request bitwise its uninterrupted run, every
control differing, enough natural preemptions, every model, setting and mode)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from gdn_evidence.e2e.preemption import results_table

from ..doc_blocks import marked_block

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "preemption.json"
DOC = ROOT / "docs" / "preemption.md"
MIN_NATURAL_PREEMPTIONS = 5


def records():
    return json.loads(EVIDENCE.read_text())["cases"]


def test_the_docs_table_is_the_evidence_files():
    text = DOC.read_text()
    table = marked_block(text, "preemption-table")
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


def test_cached_kinds_resume_past_the_prompt_and_their_controls_differ():
    cases = records()
    cached = [c for c in cases if c["kind"] == "forced-cached"]
    assert cached and all(
        c["resumes_with_hit_past_prompt"] > 0 for c in cached if c["arm"] == "replay"
    )
    for kind in ("forced-cached", "multi-turn"):
        control = [c for c in cases if c["kind"] == kind and c["arm"] == "control"]
        assert control and all(c["identical"] == 0 for c in control)
    turns = [c for c in cases if c["kind"] == "multi-turn"]
    assert all(
        (c["turn_cached_tokens"] <= c["previous_prompt"]) == (c["arm"] == "replay") for c in turns
    )


def test_the_cost_section_quotes_the_longest_replays_of_the_graphs_stage():
    graphs = [c for c in records() if c["cuda_graphs"] and c["engine"]["model_runner"] == "v1"]
    route = max(c["replay_seconds"] for c in graphs if c["mode"] == "route")
    golden = sorted(c["replay_seconds"] for c in graphs if c["mode"] == "golden")
    doc = " ".join(DOC.read_text().split())
    assert f"it took up to {route:.2f} s per run" in doc
    assert f"the first forced run of mode golden took {golden[-2]:.1f}–{golden[-1]:.1f} s" in doc


def test_the_cost_section_quotes_the_replay_per_preempted_request():
    doc = " ".join(DOC.read_text().split())
    for mode in ("route", "golden"):
        per = [
            1e3 * c["replay_seconds"] / c["preemptions"]
            for c in records()
            if c["arm"] == "replay"
            and c["cuda_graphs"]
            and c["engine"]["model_runner"] == "v1"
            and c["mode"] == mode
            and c["preemptions"] > 0
        ]
        assert f"{len(per)} runs with preemptions of each mode" in doc
        assert f"{mode} {statistics.median(per):.1f} ms" in doc
        assert f"{min(per):.1f}" in doc and f"{max(per):.1f} ms" in doc
