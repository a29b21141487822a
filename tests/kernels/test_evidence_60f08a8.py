"""docs/kernels.md quotes stage golden-long and stage kernels at 60f08a8
(docs/evidence/h200_engine/60f08a8/, an H100) as their evidence files say: section "Stage
golden-long at 60f08a8: the slow rounds are the GPU waiting"."""

from __future__ import annotations

import functools
import json
import statistics

import numpy as np
import pytest
import torch

from gdn_evidence.e2e.round_samples import read_cpu_samples, read_gpu_samples, round_samples
from vllm_gdn_invariant.models.tiny import BENCH_QWEN3_NEXT

from ..doc_blocks import marked_block
from .test_evidence_df9fd2b import spread
from .test_evidence_docs import DOC, ROOT, device_span, flat_doc

RUN = ROOT / "docs" / "evidence" / "h200_engine" / "60f08a8"
THROUGHPUT, LATENCY = "decode_throughput_vs_route", "itl_vs_route"
META_FIELDS = ("architectures", "model_type", "torch_dtype")  # config.json's, not the config's
SOURCES = "e00b906ea41eb313ff72772b919a0eff5fa0bb9104460be4bc9174c0fd70082f"  # 60f08a8's digest


@functools.cache
def load(name: str) -> dict | list:
    return json.loads((RUN / name).read_text())


def decode_rows() -> list[dict]:
    return [r for r in load("round_samples.json") if r["workload"] == "decode"]


def decode_table(decode: list[dict]) -> str:
    """docs/kernels.md's table of a golden-long run's decode rounds from its round samples."""
    rows = [
        "| round | arm | seconds | tokens/s | preempted | GPU samples | utilization (median) "
        "| GPU busy (s) | GPU idle (s) | CPU busy | CPU steal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in decode:
        rows.append(
            f"| {r['round'] + 1} | {r['arm']} | {r['seconds']:.2f} | {r['output_tok_s']:.0f} "
            f"| {r['preempted']} | {r['gpu_samples']} | {r['utilization_median']:.1f} % "
            f"| {r['gpu_busy_s']:.2f} | {max(0.0, r['seconds'] - r['gpu_busy_s']):.2f} "
            f"| {100 * r['cpu_busy']:.1f} % | {100 * r['cpu_steal']:.2f} % |"
        )
    return "\n".join(rows)


def test_the_runs_are_60f08a8s_on_an_h100():
    """Both files' commit fields are wrong (COMMITS.md); their sources' digest is 60f08a8's."""
    engine, kernels = load("bench_engine_golden_long.json"), load("bench_decode.json")
    assert engine["provenance"]["git_commit"] == "60f08a8b3d2d4c6e0c1f4cbbd8c2e5bb2bd0f0a0"
    assert kernels["provenance"]["git_commit"] == "unknown"
    for report in (engine, kernels):
        assert report["provenance"]["source_sha256"] == SOURCES
        assert "H100" in report["provenance"]["device"] and not report["provenance"]["git_dirty"]
    assert engine["provenance"]["model"]["num_hidden_layers"] == 24
    assert all(engine["engines"][arm]["status"] == "READY" for arm in ("route", "golden"))
    assert engine["settle_rounds"] and len(engine["rounds"]) == 5
    assert not kernels["complete"] and kernels["summary"]["cases"] == 62
    have = {(c["op"], c["state_dtype"], c["batch"]) for c in kernels["cases"]}
    missing = {
        (op, dtype, 1024)
        for op in ("recurrent", "conv", "decode_step")
        for dtype in ("float32", "bfloat16")
    } - have
    assert missing == {
        ("decode_step", "float32", 1024),
        *((op, "bfloat16", 1024) for op in ("recurrent", "conv", "decode_step")),
    }


SAMPLED_RUNS = ("60f08a8", "12a6389")  # golden-long runs with GPU and CPU samples beside them


@pytest.mark.parametrize("commit", SAMPLED_RUNS)
def test_the_round_samples_are_what_the_script_makes_of_the_run(commit):
    run = RUN.parent / commit
    report = json.loads((run / "bench_engine_golden_long.json").read_text())
    rows = round_samples(
        report,
        read_gpu_samples(run / "gpu_samples.csv"),
        read_cpu_samples(run / "gpu_samples_cpu.txt"),
    )
    assert rows == json.loads((run / "round_samples.json").read_text())


@pytest.mark.parametrize("commit", SAMPLED_RUNS)
def test_the_golden_long_table_is_its_evidence_files(commit):
    rows = json.loads((RUN.parent / commit / "round_samples.json").read_text())
    decode = [r for r in rows if r["workload"] == "decode"]
    assert marked_block(DOC.read_text(), f"golden-long-{commit}-table") == decode_table(decode)


def test_the_rounds_analysis_is_quoted():
    doc = flat_doc()
    rows, decode = load("round_samples.json"), decode_rows()
    engine = load("bench_engine_golden_long.json")
    starts = [engine["engines"][arm]["start_seconds"] for arm in ("route", "golden")]
    assert f"The engines took {starts[0]:.0f} and {starts[1]:.0f} s to start" in doc
    assert {r["preempted"] for r in rows} == {0} and {r["sm_mhz_min"] for r in rows} == {1980}
    kv = {engine["engines"][arm]["kv_cache"][0].split("size: ")[1] for arm in ("route", "golden")}
    assert kv == {"375,954 tokens"} and "each engine's KV cache held 375,954 tokens" in doc
    busy = [100 * r["cpu_busy"] for r in rows]
    steal = max(100 * r["cpu_steal"] for r in rows)
    assert f"{min(busy):.1f}–{max(busy):.1f} % busy over every window" in doc
    assert f"with at most {steal:.2f} % stolen" in doc
    seconds = np.array([r["seconds"] for r in decode])
    gpu = np.array([r["gpu_busy_s"] for r in decode])
    idle, busy_corr = np.corrcoef(seconds, seconds - gpu)[0, 1], np.corrcoef(seconds, gpu)[0, 1]
    assert f"(correlation {idle:.2f} over the {len(decode)} decode rounds)" in doc
    assert f"not the time it was busy ({busy_corr:.2f})" in doc
    medians = [
        statistics.median(r["gpu_busy_s"] for r in decode if r["arm"] == a)
        for a in ("route", "golden")
    ]
    assert (
        f"busy time per round was {gpu.min():.2f}–{gpu.max():.2f} s, with a median of "
        f"{medians[0]:.2f} s for route and {medians[1]:.2f} s for golden, while the rounds took "
        f"{seconds.min():.2f}–{seconds.max():.2f} s" in doc
    )
    gaps = seconds - gpu
    assert f"by {gaps.min():.1f}–{gaps.max():.1f} s a round in either arm" in doc
    summary = engine["summary"]
    ratios = summary["round_ratios"]["golden"][THROUGHPUT]
    spread = summary["ratio_spread"]["golden"]
    assert (
        f"(this run: ratio spread {100 * spread[THROUGHPUT]['spread']:.2f} %, round ratios "
        f"{min(ratios):.3f}–{max(ratios):.3f}, median {spread[THROUGHPUT]['median']:.4f}, ratio "
        f"of medians {summary['ratios']['golden'][THROUGHPUT]:.4f})" in doc
    )
    itl = [r for r in rows if r["workload"] == "itl"]
    assert {r["gpu_samples"] for r in itl} == {1}
    low = min(r["utilization_median"] for r in itl)
    high = max(r["utilization_median"] for r in itl)
    assert f"(each one sample, {low:.0f}–{high:.0f} %)" in doc
    ms = summary["medians"]
    assert (
        f"was {ms['route']['itl_ms']:.3f} ms for route and {ms['golden']['itl_ms']:.3f} ms for "
        f"golden by the median (golden/route {summary['ratios']['golden'][LATENCY]:.4f}, round "
        f"ratios spread {100 * spread[LATENCY]['spread']:.2f} %)" in doc
    )


def test_the_kernels_stage_is_quoted():
    doc = flat_doc()
    log = (RUN / "pytest_kernels.log").read_text()
    assert "174 passed" in log and "failed" not in log
    assert "(stage `kernels`: 174 passed in 268 s," in doc
    cases = load("bench_decode.json")["cases"]

    def device(op: str, state: str) -> str:
        return device_span(cases, op, state, 64, fmt=".3f")

    assert (
        f"the recurrent step {device('recurrent', 'bfloat16')} vLLM with a bf16 state and "
        f"{device('recurrent', 'float32')} with fp32, the decode step "
        f"{device('decode_step', 'bfloat16')} and {device('decode_step', 'float32')}" in doc
    )


HOST_RUNS = (
    ("f9eea9a", "bench_engine_golden_long.json"),
    ("3af9122", "bench_engine_golden_deep_1536.json"),
    ("2046380", "bench_engine_golden_long.json"),
    ("df9fd2b", "bench_engine_golden_long.json"),
    ("df9fd2b", "bench_engine_golden_long_2.json"),
    ("60f08a8", "bench_engine_golden_long.json"),
)


def hosts_table() -> str:
    rows = [
        "| run | engine start (s) | rounds | fastest | median | slowest | spread |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for commit, name in HOST_RUNS:
        report = json.loads((RUN.parent / commit / name).read_text())
        provenance = report["provenance"]
        assert provenance["model"]["num_hidden_layers"] == 24
        assert provenance["engine"]["decode_new_tokens"] == 1536 and "H100" in provenance["device"]
        seconds = [r[arm]["decode"]["seconds"] for r in report["rounds"] for arm in r["order"]]
        median = statistics.median(seconds)
        rows.append(
            f"| {commit}/{name} | {report['engines']['route']['start_seconds']:.0f} "
            f"| {len(report['rounds'])} | {min(seconds):.2f} | {median:.2f} | {max(seconds):.2f} "
            f"| {spread(seconds):.1f} % |"
        )
    return "\n".join(rows)


def test_the_hosts_table_is_its_evidence_files():
    assert marked_block(DOC.read_text(), "golden-long-hosts-table") == hosts_table()
    fastest = [float(row.split("|")[4]) for row in hosts_table().splitlines()[2:]]
    assert (
        f"the fastest decode round of every run took {min(fastest):.2f}–{max(fastest):.2f} s"
        in flat_doc()
    )


def test_the_busy_time_per_step_is_quoted():
    gpu = statistics.median(r["gpu_busy_s"] for r in decode_rows())
    tokens = load("bench_engine_golden_long.json")["provenance"]["engine"]["decode_new_tokens"]
    assert f"(about {1000 * gpu / tokens:.1f} ms of GPU time, {tokens} a round)" in flat_doc()


def test_the_bench_models_sizes_are_quoted():
    """The parameter counts of the bench model at 24 and 48 layers, as transformers builds it on
    the meta device (no memory), and what two engines with 8 or 13.5 GiB KV caches hold."""
    models = pytest.importorskip("transformers.models.qwen3_next")
    counts = {}
    for layers in (24, 48):
        fields = {k: v for k, v in BENCH_QWEN3_NEXT.items() if k not in META_FIELDS}
        with torch.device("meta"):
            model = models.Qwen3NextForCausalLM(
                models.Qwen3NextConfig(**{**fields, "num_hidden_layers": layers})
            )
        counts[layers] = sum(p.numel() for p in model.parameters())
    gib = {layers: 2 * n / 2**30 for layers, n in counts.items()}
    doc = flat_doc()
    assert (
        f"The 48-layer bench model has {counts[48] / 1e9:.2f} B parameters, {gib[48]:.1f} GiB in "
        f"bf16 (counted on the meta device with transformers' `Qwen3NextForCausalLM`; 24 layers: "
        f"{counts[24] / 1e9:.2f} B, {gib[24]:.1f} GiB)" in doc
    )
    assert f"hold about {2 * (gib[48] + 8):.0f} GiB of an H100's 80" in doc
    assert f"they would hold about {2 * (gib[48] + 13.5):.0f} GiB" in doc
