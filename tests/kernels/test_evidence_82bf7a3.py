"""docs/kernels.md quotes the H100 runs that took the L2 request out of the package as their
evidence files say: stage ``l2-ahead-engine`` at 82bf7a3 (mode route, mode golden with the
request, mode golden without it, by device time) and stage ``engine-decode`` at 168d930."""

from __future__ import annotations

import json
from pathlib import Path

from .test_evidence_docs import DOC, ROOT, flat_doc, git

RUNS = ROOT / "docs" / "evidence" / "h200_engine"
L2_AHEAD_PROFILE = RUNS / "82bf7a3" / "bench_engine_l2_ahead_profile.json"
DECODE_LAYOUT_ROUTE = RUNS / "168d930" / "engine_decode_layout_route.json"
GOLDEN_PROFILE_CUT = RUNS / "168d930" / "bench_engine_golden_profile.json"
ARMS = {
    "route": "mode route (vLLM's kernel)",
    "golden": "mode golden, with the request",
    "golden_without_l2_ahead": "mode golden, without it",
}
REMOVAL = "1e3b478"  # the commit that took L2_AHEAD out of the package
CONTROL_LOG = "gdn_invariant control without l2_ahead: recurrent_step_kernel binds L2_AHEAD=False"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def full_grid(arm: dict) -> dict:
    """The decode kernel's most-timed grid in one profiled run: its launches at B = 128."""
    (kernel,) = [k for k in arm["top_kernels"] if k["category"] == "gdn_decode"]
    return kernel["grids"][0]


def per_launch(arm: dict) -> float:
    grid = full_grid(arm)
    return grid["us"] / grid["launches"]


def test_the_runs_are_of_their_commits_and_clean():
    for path, commit in [(L2_AHEAD_PROFILE, "82bf7a3"), (DECODE_LAYOUT_ROUTE, "168d930")]:
        provenance = load(path)["provenance"]
        assert provenance["git_commit"].startswith(commit) and provenance["git_dirty"] is False
        assert provenance["device"] == "NVIDIA H100 80GB HBM3"


def test_only_the_third_arm_ran_without_the_request():
    engines = load(L2_AHEAD_PROFILE)["engines"]
    for arm in ARMS:
        logs = engines[arm]["plugin_log"]
        loaded = [line for line in logs if CONTROL_LOG in line]
        # the LLM process and the engine core each load it
        assert len(loaded) == (2 if arm == "golden_without_l2_ahead" else 0), arm


def test_the_arms_table_is_its_evidence_file():
    profile = load(L2_AHEAD_PROFILE)["profile"]
    text = DOC.read_text()
    for arm, label in ARMS.items():
        summary = profile["arms"][arm]
        if arm == "route":
            ratios = "| 1 | 1 | 1 |"
        else:
            rounds = profile["vs_route"][arm]["device_time_ratio_rounds"]
            ratios = "| " + " | ".join(f"{r:.4f}" for r in rounds) + " |"
        grid = full_grid(summary)
        shape = " x ".join(str(n) for n in grid["grid"] if n != 1)
        row = (
            f"| {label} {ratios} {summary['categories_us']['gdn_decode'] / 1e3:.2f} ms | "
            f"{per_launch(summary):.2f} µs ({shape}, {grid['launches']}) |"
        )
        assert row in text, row


def test_the_request_costs_what_the_doc_says():
    arms = load(L2_AHEAD_PROFILE)["profile"]["arms"]
    vllm, ours, without = (per_launch(arms[a]) for a in ARMS)
    vs_route = load(L2_AHEAD_PROFILE)["profile"]["vs_route"]
    doc = flat_doc()
    assert ours > without  # the measured direction the package follows
    assert f"the request costs the kernel {100 * (ours / without - 1):.1f} % of its time" in doc
    assert f"ours runs at {vllm / without:.3f}x vLLM's per launch in the engine" in doc
    low, high = (
        f(vs_route["golden_without_l2_ahead"]["device_time_ratio_rounds"]) for f in (min, max)
    )
    with_request = vs_route["golden"]["device_time_ratio_rounds"]
    assert (
        f"mode golden costs {100 * (low - 1):.1f}–{100 * (high - 1):.1f} % of the device time "
        f"where 344febd's kernel cost {100 * (sum(with_request) / 3 - 1):.1f} %" in doc
    )
    launches = [full_grid(arms[a])["launches"] for a in ("route", "golden")]
    assert f"ran nearly the same launches at B = 128 ({launches[0]} and {launches[1]};" in doc


def test_the_engine_runs_vllms_kernel_faster_than_back_to_back():
    engine = load(DECODE_LAYOUT_ROUTE)["result"]["arms"]["engine"]
    arms = load(L2_AHEAD_PROFILE)["profile"]["arms"]
    in_engine = {a: per_launch(arms[a]) for a in ("route", "golden")}
    doc = flat_doc()
    assert (
        f"({in_engine['route']:.2f} against {engine['vllm_us']:.2f} µs, 168d930's run below), "
        f"ours with the request not at all ({in_engine['golden']:.2f} against "
        f"{engine['ours_us']:.2f} µs)" in doc
    )
    assert in_engine["route"] < 0.96 * engine["vllm_us"]


def test_the_timed_round_is_quoted_as_no_throughput_figure():
    medians = load(L2_AHEAD_PROFILE)["summary"]["medians"]
    tok_s = [f"{medians[a]['decode_tok_s']:.0f}" for a in ARMS]
    assert (
        f"(three engines unpinned on 16 CPUs: route {tok_s[0]}, golden {tok_s[1]}, without the "
        f"request {tok_s[2]} tokens/s)" in flat_doc()
    )


def test_the_168d930_stage_is_quoted():
    arms = load(DECODE_LAYOUT_ROUTE)["result"]["arms"]
    engine = arms["engine"]
    doc = flat_doc()
    assert (
        f"gave vLLM/ours {engine['vllm_us']:.2f} / {engine['ours_us']:.2f} µs = "
        f"{engine['vllm_over_ours']:.3f} on the engine's pool, "
        f"{arms['engine_sorted']['vllm_over_ours']:.3f} with the indices sorted, "
        f"{arms['compact']['vllm_over_ours']:.3f} compact" in doc
    )
    cut = load(GOLDEN_PROFILE_CUT)
    assert "profile" not in cut and len(cut["rounds"]) == 1
    (ratio,) = cut["summary"]["round_ratios"]["golden"]["decode_throughput_vs_route"]
    assert f"after its one timed round ({ratio:.4f}, a single round)" in doc
    log = (RUNS / "168d930" / "engine_decode_layout.log").read_text().splitlines()
    assert "Padding mamba page size" in log[-1]  # the engine's start, then the limit
    assert "`engine_decode_layout.log` ends at the engine's start" in doc


def test_the_commit_the_doc_names_took_the_request_out():
    assert f"since {REMOVAL} the recurrent kernel no longer asks" in flat_doc()
    path = "vllm_gdn_invariant/kernels/recurrent.py"
    assert "L2_AHEAD" in git("show", f"{REMOVAL}^:{path}")
    assert "L2_AHEAD" not in git("show", f"{REMOVAL}:{path}")
    assert "L2_AHEAD" not in (ROOT / path).read_text()


def test_where_issue_20_stands_quotes_the_engine_per_launch_ratio():
    arms = load(L2_AHEAD_PROFILE)["profile"]["arms"]
    in_engine = per_launch(arms["route"]) / per_launch(arms["golden_without_l2_ahead"])
    rounds = load(L2_AHEAD_PROFILE)["profile"]["vs_route"]["golden_without_l2_ahead"][
        "device_time_ratio_rounds"
    ]
    low, high = (100 * (r - 1) for r in (min(rounds), max(rounds)))
    assert (
        f"In the engine the bf16 recurrent step runs at {in_engine:.3f}x vLLM's per launch at "
        f"B = 128, and mode golden costs {low:.1f}–{high:.1f} % of the device time (8 layers, "
        "profiled;"
    ) in flat_doc()
