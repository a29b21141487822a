"""docs/routing.md's evidence table is what the committed JSON says."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "mixed_step_invariance.json"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "mixed_step_invariance", ROOT / "scripts" / "mixed_step_invariance.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_routing_doc_holds_every_row_of_the_evidence_summary():
    doc = (ROOT / "docs" / "routing.md").read_text()
    rows = load_script().summary(str(EVIDENCE)).splitlines()
    assert len(rows) == 16
    missing = [row for row in rows if row not in doc]
    assert not missing, missing


def test_evidence_routed_rows_are_all_bitwise_equal_and_cover_both_versions_and_installs():
    cases = json.loads(EVIDENCE.read_text())["cases"]
    routed = [c for c in cases if c["plugin"]]
    keys = ("out_differ", "state_differ", "conv_differ", "following_out_differ")
    prefill_keys = [f"prefill_{k}_differ_vs_unpatched" for k in ("out", "state", "conv")]
    assert {(c["vllm"], c["impl"], c["H"], c["state_dtype"]) for c in routed} == {
        (v, impl, h, dtype)
        for v in ("0.30.0", "0.34.0")
        for impl in ("plugin", "patched-source")
        for h in (16, 4)
        for dtype in ("float32", "bfloat16")
    }
    assert [c for c in routed if any(c[k] for k in (*keys, *prefill_keys))] == []
    assert sum(c["state_differ"] for c in cases if not c["plugin"]) > 0
