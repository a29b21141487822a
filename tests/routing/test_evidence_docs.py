"""docs/routing.md's evidence tables are what the committed JSON says."""

import json
import sys
from pathlib import Path

from ..script_modules import load_script as load_script_module

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
EARLIER = EVIDENCE / "mixed_step_invariance.json"
RUNS = {  # file: (vLLM, prefill backend, mamba cache mode)
    "msi_0.26.0_triton.json": ("0.26.0", "triton", "none"),
    "msi_0.26.0_flashinfer_align.json": ("0.26.0", "flashinfer", "align"),
    "msi_0.34.0_triton.json": ("0.34.0", "triton", "none"),
    "msi_0.34.0_flashinfer_align.json": ("0.34.0", "flashinfer", "align"),
}
ROUTED_KEYS = (
    "out_differ",
    "state_differ",
    "conv_differ",
    "following_out_differ",
    "prefill_out_differ_vs_unpatched",
    "prefill_state_differ_vs_unpatched",
    "prefill_conv_differ_vs_unpatched",
)


def load_script():
    """scripts/mixed_step_invariance.py as a module, with scripts/ on sys.path as when it runs."""
    name = "mixed_step_invariance_under_test"
    try:
        return load_script_module(ROOT / "scripts" / "mixed_step_invariance.py", name)
    finally:
        sys.modules.pop(name, None)


def test_routing_doc_holds_every_row_of_every_evidence_summary():
    doc = (ROOT / "docs" / "routing.md").read_text()
    script = load_script()
    rows = [
        row
        for path in (EARLIER, *(EVIDENCE / f for f in RUNS))
        for row in script.summary(str(path)).splitlines()
    ]
    assert len(rows) == 16 + 4 * 4  # earlier: 2 versions x 2 installs x 4; each run: 4
    missing = [row for row in rows if row not in doc]
    assert not missing, missing


def test_each_run_is_the_full_matrix_and_every_routed_case_is_bitwise_equal():
    for name, (version, backend, mode) in RUNS.items():
        data = json.loads((EVIDENCE / name).read_text())
        assert data["provenance"]["complete"] and not data["provenance"]["failures"], name
        assert data["provenance"]["git_dirty"] is False, name
        routed = [c for c in data["cases"] if c["plugin"]]
        assert len(routed) == 56, name  # 7 compositions x 2 layouts x 2 heads x 2 dtypes
        assert {(c["vllm"], c["prefill_backend"], c["mamba_cache_mode"]) for c in routed} == {
            (version, backend, mode)
        }
        bad = [c for c in routed if any(c[k] for k in ROUTED_KEYS)]
        bad += [c for c in routed if c["prefill_checkpoint_differ_vs_unpatched"]]
        assert bad == [], name
        assert sum(c["state_differ"] for c in data["cases"] if not c["plugin"]) > 0, name


def test_flashinfer_checkpoints_were_exported_on_0_34_and_compared():
    cases = json.loads((EVIDENCE / "msi_0.34.0_flashinfer_align.json").read_text())["cases"]
    routed = [c for c in cases if c["plugin"]]
    assert sum(c["checkpoint_plan"] for c in routed) > 0
    assert sum(c["checkpoints"] for c in routed) > 0


def test_earlier_evidence_covers_both_versions_and_installs():
    cases = json.loads(EARLIER.read_text())["cases"]
    routed = [c for c in cases if c["plugin"]]
    assert {(c["vllm"], c["impl"], c["H"], c["state_dtype"]) for c in routed} == {
        (v, impl, h, dtype)
        for v in ("0.30.0", "0.34.0")
        for impl in ("plugin", "patched-source")
        for h in (16, 4)
        for dtype in ("float32", "bfloat16")
    }
    assert [c for c in routed if any(c[k] for k in ROUTED_KEYS)] == []


def flat_routing_doc() -> str:
    return " ".join((ROOT / "docs" / "routing.md").read_text().split())


def test_the_doc_counts_the_fp32_cases_where_vllms_mixed_path_changed_the_state():
    unrouted = [
        c
        for name in RUNS
        for c in json.loads((EVIDENCE / name).read_text())["cases"]
        if not c["plugin"] and c["state_dtype"] == "float32"
    ]
    changed = [c for c in unrouted if c["state_differ"]]
    unchanged = [c for c in unrouted if not c["state_differ"]]
    assert {
        (c["vllm"], c["prefill_backend"], c["decodes"], tuple(c["prefills"]), c["H"])
        for c in unchanged
    } == {("0.34.0", "flashinfer", 1, (37,), 4)}
    keys = ("out_differ", "state_differ", "conv_differ", "following_out_differ")
    assert all(not any(c[k] for k in keys) for c in unchanged)  # "without any difference"
    assert (
        f"changed the decode rows' recurrent state in {len(changed)} of the {len(unrouted)} "
        f"fp32 cases" in flat_routing_doc()
    )


def test_the_speed_paragraph_quotes_the_round_ratios_and_the_one_case_met_in_every_round():
    cases = [
        (version, c)
        for version in ("0.30.0", "0.34.0")
        for c in json.loads((EVIDENCE / f"bench_mixed_step_{version}.json").read_text())["cases"]
    ]
    per_case = {
        (version, c["decodes"], c["prefill_tokens"], c["state_dtype"]): [
            r / u for r, u in zip(c["routed_rounds_us"], c["upstream_rounds_us"], strict=True)
        ]
        for version, c in cases
    }
    ratios = [r for rounds in per_case.values() for r in rounds]
    met = [key for key, rounds in per_case.items() if max(rounds) <= 1.0]
    straddling = [key for key, rounds in per_case.items() if min(rounds) <= 1.0 < max(rounds)]
    assert met == [("0.30.0", 64, 8192, "bfloat16")]
    doc = flat_routing_doc()
    assert f"the ratios ran {min(ratios):.2f}–{max(ratios):.2f}×" in doc
    assert f"in {len(straddling)} of the {len(per_case)} cases they fall on both sides" in doc
    (rounds,) = [per_case[key] for key in met]
    assert f"bf16 state: {min(rounds):.2f}–{max(rounds):.2f}×)" in doc
