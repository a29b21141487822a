"""docs/kernels.md quotes the two golden-long runs at df9fd2b (docs/evidence/h200_engine/df9fd2b/,
an H100) as their evidence files say: section "Stage golden-long at df9fd2b, twice"."""

from __future__ import annotations

import csv
import functools
import json
import statistics
from pathlib import Path

from ..doc_blocks import marked_block
from .test_evidence_docs import DOC, ROOT, flat_doc

RUN = ROOT / "docs" / "evidence" / "h200_engine" / "df9fd2b"
REPORTS = (RUN / "bench_engine_golden_long.json", RUN / "bench_engine_golden_long_2.json")
EARLIER = ROOT / "docs" / "evidence" / "h200_engine" / "2046380" / "bench_engine_golden_long.json"
THROUGHPUT, LATENCY = "decode_throughput_vs_route", "itl_vs_route"
BUSY = 50  # % utilization from which a sample counts as taken while a workload ran


@functools.cache
def report(path: Path) -> dict:
    return json.loads(path.read_text())


def rates(path: Path, arm: str) -> list[float]:
    return [r[arm]["decode"]["output_tok_s"] for r in report(path)["rounds"]]


def spread(values: list[float]) -> float:
    """Range over median, in %."""
    return 100 * (max(values) - min(values)) / statistics.median(values)


def arm_spreads() -> list[float]:
    """Each run's and arm's decode throughput spread over its rounds, in %."""
    return [spread(rates(p, arm)) for p in REPORTS for arm in ("route", "golden")]


def table() -> str:
    rows = [
        "| run | route (tokens/s) | golden (tokens/s) | throughput round ratios | spread | median "
        "| ratio of medians | ITL route / golden (ms) | ITL ratio | ITL spread |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run, path in enumerate(REPORTS, 1):
        summary = report(path)["summary"]
        rounds = summary["round_ratios"]["golden"][THROUGHPUT]
        latency = summary["round_ratios"]["golden"][LATENCY]
        assert len(rounds) == len(latency) == 7
        route, golden = rates(path, "route"), rates(path, "golden")
        itl = summary["medians"]
        rows.append(
            f"| {run} | {min(route):.0f}–{max(route):.0f} | {min(golden):.0f}–{max(golden):.0f} "
            f"| {min(rounds):.3f}–{max(rounds):.3f} "
            f"| {100 * summary['ratio_spread']['golden'][THROUGHPUT]['spread']:.2f} % "
            f"| {summary['ratio_spread']['golden'][THROUGHPUT]['median']:.4f} "
            f"| {summary['ratios']['golden'][THROUGHPUT]:.4f} "
            f"| {itl['route']['itl_ms']:.3f} / {itl['golden']['itl_ms']:.3f} "
            f"| {summary['ratios']['golden'][LATENCY]:.4f} "
            f"| {100 * summary['ratio_spread']['golden'][LATENCY]['spread']:.2f} % |"
        )
    return "\n".join(rows)


def test_the_runs_are_df9fd2bs_on_an_h100_with_24_layers():
    for path in REPORTS:
        provenance = report(path)["provenance"]
        assert provenance["git_commit"][:7] == "df9fd2b" and not provenance["git_dirty"]
        assert provenance["model"]["num_hidden_layers"] == 24 and "H100" in provenance["device"]
        assert provenance["engine"]["kv_cache_gib"] == 8.0
        engines = report(path)["engines"]
        assert all(engines[arm]["status"] == "READY" for arm in ("route", "golden"))


def test_the_golden_long_table_is_its_evidence_files():
    assert marked_block(DOC.read_text(), "golden-long-df9fd2b-table") == table()


def test_the_spread_and_the_first_rounds_are_quoted():
    doc = flat_doc()
    spreads = arm_spreads()
    assert f"decode throughput moved by {min(spreads):.0f}–{max(spreads):.0f} % from round" in doc
    earlier = [r["route"]["decode"]["output_tok_s"] for r in report(EARLIER)["rounds"]][1:]
    assert f"route's six rounds after the first lay within {spread(earlier):.2f} %)" in doc
    waits = [report(p)["engines"]["route"]["warm_wait_seconds"] for p in REPORTS]
    assert f"(route's for {waits[0]} and {waits[1]} s after it said READY)" in doc
    second = report(REPORTS[1])["rounds"]
    route = rates(REPORTS[1], "route")
    assert second[0]["order"][0] == "route" and route[0] == min(route)
    assert (
        f"in the second route's first round was still its slowest ({route[0]:.0f} tokens/s "
        f"against {min(route[1:]):.0f}–{max(route[1:]):.0f})." in doc
    )
    latency = [report(p)["summary"]["ratios"]["golden"][LATENCY] for p in REPORTS]
    assert all(ratio <= 1 for ratio in latency)
    assert f"by the median ({latency[0]:.4f} and {latency[1]:.4f})" in doc
    throughput = [
        100 * report(p)["summary"]["ratio_spread"]["golden"][THROUGHPUT]["spread"] for p in REPORTS
    ]
    assert f"on an H100 whose rounds spread by {throughput[0]:.2f} and {throughput[1]:.2f} %" in doc


def test_the_gpu_samples_are_quoted():
    with open(RUN / "gpu_samples_2.csv", newline="") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f)]
    busy = [r for r in rows if int(r[6].split()[0]) >= BUSY]
    clocks = {r[1] for r in busy}
    reasons = {int(r[5], 16) for r in busy}
    power = max(float(r[3].split()[0]) for r in busy)
    temperature = max(int(r[4]) for r in busy)
    utilization = [int(r[6].split()[0]) for r in busy]
    load = max(float(line.split()[0]) for line in (RUN / "loadavg_2.txt").read_text().splitlines())
    doc = flat_doc()
    assert clocks == {"1980 MHz"} and reasons == {0}
    assert (
        f"the SM clock was 1980 MHz (the maximum) in all {len(busy)} samples with the GPU "
        f"{BUSY} % busy or more, no clock event reason was active in any, power stayed at or "
        f"below {power:.0f} W of 700 W and the GPU at or below {temperature} °C" in doc
    )
    assert (
        f"Utilization in those samples was {statistics.median(utilization):.0f} % by the median "
        f"and {min(utilization)} % in the lowest, and the CPUs' load average stayed at or below "
        f"{load:.2f} of 16" in doc
    )


def test_the_readme_quotes_the_runs():
    readme = " ".join((ROOT / "README.md").read_text().split())
    medians = [
        report(p)["summary"]["ratio_spread"]["golden"][THROUGHPUT]["median"] for p in REPORTS
    ]
    latency = [report(p)["summary"]["ratios"]["golden"][LATENCY] for p in REPORTS]
    spreads = arm_spreads()
    assert (
        f"decode throughput move by {min(spreads):.0f}–{max(spreads):.0f} % from round to round"
        in readme
    )
    assert (
        f"(medians of the round ratios {medians[0]:.4f} and {medians[1]:.4f}, latency "
        f"{latency[0]:.4f}× and {latency[1]:.4f}×)" in readme
    )


def test_the_clock_event_counters_are_quoted():
    text = (RUN / "nvidia_smi_between_runs.txt").read_text()
    counters = {
        name.strip(): int(value.split()[0])
        for name, value in (
            line.split(":", 1) for line in text.splitlines() if line.endswith(" us")
        )
    }
    assert counters["SW Thermal Slowdown"] == counters["HW Thermal Slowdown"] == 0
    assert counters["HW Power Braking"] == 0
    capped = counters["SW Power Capping"] / 1e6
    assert (
        f"showed {capped:.1f} s of software power capping since the machine started and no "
        "thermal or power-brake slowdown" in flat_doc()
    )
