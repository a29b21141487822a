"""docs/kernels.md quotes stage golden-long with 48 layers and stage kernels at 12a6389
(docs/evidence/h200_engine/12a6389/, an H100) as their evidence files say: sections "Stage
golden-long with 48 layers at 12a6389" and "Where issue 20 stands". Its round samples and
decode table are checked with 60f08a8's (test_evidence_60f08a8.py)."""

from __future__ import annotations

import functools
import json

from ..evidence_cases import cells, span
from .test_evidence_docs import ROOT, flat_doc

RUN = ROOT / "docs" / "evidence" / "h200_engine" / "12a6389"
ACCEPTANCE = ROOT / "docs" / "evidence" / "bench_engine_golden.json"
THROUGHPUT, LATENCY = "decode_throughput_vs_route", "itl_vs_route"
COMMIT = "12a63893956637c830af37f7510d74b66fbf280a"
SOURCES = "153f23a9121fe92ff6bcdfdfafb648534b0a74da672bdbff4986118b88df0460"  # 12a6389's digest


@functools.cache
def load(name: str) -> dict | list:
    return json.loads((RUN / name).read_text())


def decode_rows() -> list[dict]:
    return [r for r in load("round_samples.json") if r["workload"] == "decode"]


def device(op: str, state: str, large: bool, key: str = "speed_vs_vllm_device") -> list[float]:
    """``key`` of the kernels run's ``op`` cases with a ``state`` state, from B = 64 or below it."""
    low, high = (64, 1024) if large else (1, 32)
    return [c[key] for c in cells(load("bench_decode.json")["cases"], op, state, low, high)]


def test_the_runs_are_12a6389s_on_an_h100_with_48_layers():
    engine, kernels = load("bench_engine_golden_long.json"), load("bench_decode.json")
    for report in (engine, kernels):
        provenance = report["provenance"]
        assert (provenance["git_commit"], provenance["git_dirty"]) == (COMMIT, False)
        assert provenance["source_sha256"] == SOURCES
        assert "H100" in provenance["device"]
    assert engine["provenance"]["model"]["num_hidden_layers"] == 48
    assert engine["provenance"]["engine"]["max_num_seqs"] == 128
    assert engine["provenance"]["engine"]["decode_new_tokens"] == 768
    assert all(engine["engines"][arm]["status"] == "READY" for arm in ("route", "golden"))
    assert len(engine["settle_rounds"]) == 1 and len(engine["rounds"]) == 6
    assert kernels["complete"] and len(kernels["cases"]) == 66
    assert kernels["summary"]["api_bound_misses"] == []


def test_the_acceptance_file_is_this_run():
    assert ACCEPTANCE.read_bytes() == (RUN / "bench_engine_golden_long.json").read_bytes()


def test_the_rounds_analysis_is_quoted():
    doc = flat_doc()
    rows, decode = load("round_samples.json"), decode_rows()
    engine = load("bench_engine_golden_long.json")
    starts = [engine["engines"][arm]["start_seconds"] for arm in ("route", "golden")]
    assert f"The engines took {starts[0]:.0f} and {starts[1]:.0f} s to start" in doc
    kv = {engine["engines"][arm]["kv_cache"][0].split("size: ")[1] for arm in ("route", "golden")}
    assert kv == {"187,830 tokens"} and "each one's KV cache held 187,830 tokens" in doc
    assert {r["preempted"] for r in rows} == {0}
    assert {r["utilization_median"] for r in decode} == {100.0}
    low = sorted(decode, key=lambda r: r["gpu_busy_s"])[:2]
    assert {r["arm"] for r in low} == {"route"}
    assert sorted(r["utilization_min"] for r in low) == [33.0, 40.0]
    assert max(r["seconds"] for r in low) < max(r["seconds"] for r in decode)
    clocks = [r["sm_mhz_min"] for r in rows]
    assert f"the SM clock was {min(clocks):.0f}–{max(clocks):.0f} MHz" in doc
    busy = [100 * r["cpu_busy"] for r in rows]
    steal = max(100 * r["cpu_steal"] for r in rows)
    assert f"the host's CPUs were {span(busy, '.1f')} % busy with at most {steal:.2f} %" in doc
    seconds = {a: [r["seconds"] for r in decode if r["arm"] == a] for a in ("route", "golden")}
    assert max(seconds["route"]) < min(seconds["golden"])  # every golden round is slower
    assert all(max(s) / min(s) - 1 < 0.004 for s in seconds.values())  # "within 0.4 %"
    assert (
        f"route took {span(seconds['route'], '.2f')} s a decode round and golden "
        f"{span(seconds['golden'], '.2f')}" in doc
    )
    summary = engine["summary"]
    ratios = summary["round_ratios"]["golden"]
    spread = summary["ratio_spread"]["golden"]
    interval = spread[THROUGHPUT]["median_interval"]
    assert (
        f"(this run: ratio of medians {summary['ratios']['golden'][THROUGHPUT]:.4f}, round ratios "
        f"{span(ratios[THROUGHPUT], '.3f')}, median {spread[THROUGHPUT]['median']:.4f}, ratio "
        f"spread {100 * spread[THROUGHPUT]['spread']:.2f} %, a distribution-free interval for "
        f"the median round ratio {span(interval['interval'], '.3f')} at "
        f"{100 * interval['coverage']:.1f} % coverage)" in doc
    )
    assert (
        f"its rounds agreed within {100 * spread[THROUGHPUT]['spread']:.2f} %: mode golden's "
        f"decode throughput was {summary['ratios']['golden'][THROUGHPUT]:.4f}x mode route's by the "
        f"medians (round ratios {span(ratios[THROUGHPUT], '.3f')}x;" in doc
    )
    below = [r for r in ratios[THROUGHPUT] if r < 0.99]
    assert len(below) == 1 and f"One round ({below[0]:.4f}) is below 0.99" in doc
    assert summary["targets"]["golden_decode_throughput_at_least_0.99x_route"] == "inconclusive"
    assert summary["ratios"]["golden"][THROUGHPUT] >= 0.99 and spread[THROUGHPUT]["median"] >= 0.99
    assert spread[THROUGHPUT]["spread"] < 0.03
    margin = 100 * (summary["ratios"]["golden"][THROUGHPUT] - 0.99)
    assert interval["interval"][0] < 0.99 < interval["interval"][1]
    assert (
        f"by a margin of {margin:.1f} %; the interval for the median round ratio reaches just "
        f"below 0.99 ({interval['interval'][0]:.4f})" in doc
    )
    assert (
        f"latency, golden against route, {summary['ratios']['golden'][LATENCY]:.4f}x by the "
        f"medians (round ratios {span(ratios[LATENCY], '.3f')}, spread "
        f"{100 * spread[LATENCY]['spread']:.2f} %)" in doc
    )


def test_the_kernels_stage_is_quoted():
    doc = flat_doc()
    log = (RUN / "pytest_kernels.log").read_text()
    assert "174 passed, 2 warnings in 199.30s" in log and "failed" not in log
    assert "(`pytest_kernels.log`: 174 passed in 199 s)" in doc
    cases = load("bench_decode.json")["cases"]
    small_wall = min(c["speed_vs_vllm_wall"] for c in cases if c["batch"] < 64)
    bf16_recurrent = span(device("recurrent", "bfloat16", True), ".3f")
    cold = [c["speed_vs_vllm_device_cold"] for c in cells(cases, "conv", "bfloat16")]
    assert (
        f"every op's wall time below B = 64 {small_wall:.3f}x "
        f"vLLM or more and the conv with an fp32 cache {min(device('conv', 'float32', True)):.3f}x "
        "or more in device time" in doc
    )
    assert (
        f"the recurrent step with a bf16 state at {bf16_recurrent}x "
        f"from B = 64 and {span(device('recurrent', 'bfloat16', False), '.3f')}x below, with an "
        f"fp32 state at {span(device('recurrent', 'float32', True), '.3f')}x from B = 64, the "
        f"decode step with them ({span(device('decode_step', 'bfloat16', True), '.3f')}x and "
        f"{span(device('decode_step', 'float32', True), '.3f')}x), and the conv with a bf16 cache "
        f"in some cells ({span(device('conv', 'bfloat16', True), '.3f')}x from B = 64 and "
        f"{span(device('conv', 'bfloat16', False), '.3f')}x below; with L2 flushed "
        f"{span(cold)}x at every B)" in doc
    )
