"""Nsight Compute's counters for the recurrent decode step: ours and vLLM's, same inputs (GPU).

    python scripts/profile_recurrent.py --out ncu_recurrent.json [--batch-sizes 128,1024]

runs itself under ``ncu`` (Nsight Compute's CLI, found on PATH or in CUDA's and Nsight's usual
folders) with ``--run``, which launches, per batch size and state dtype (Qwen3-Next's TP1
heads, all rows active, bench_decode.py's inputs), vLLM's packed decode and ours
(``kernels.recurrent.launch_recurrent`` at its default launch shape, what mode golden serves)
LAUNCHES times each. ncu replays every launch of either kernel with its caches flushed and
reports METRICS: time, DRAM throughput and bytes, issue activity, achieved occupancy,
registers, and the warp stall reasons per issued instruction (where a warp's cycles go). The
JSON holds, per case and kernel, the median of each metric over the launches. Without ncu, or
when the GPU's counters are not open to this user, the JSON says so and nothing is measured.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
from glob import glob
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch
from bench_decode import QUICK, STATE_DTYPES, STATE_NAMES, GpuClock, inputs, recurrent_arms

from gdn_evidence.harness.agreement import load_providers
from gdn_evidence.harness.layer import QWEN3_NEXT_DIMS
from gdn_evidence.harness.provenance import provenance

SCHEMA = "vllm-gdn-invariant/profile-recurrent/1"
LAUNCHES = 3
KERNELS = {"recurrent_step_kernel": "ours", "packed_decode": "vllm"}
STALLS = (
    "long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "lg_throttle",
    "mio_throttle", "not_selected", "selected", "no_instruction", "barrier", "dispatch_stall",
    "drain", "membar", "branch_resolving", "tex_throttle", "imc_miss", "misc", "sleeping",
)  # fmt: skip
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__grid_size",
    "launch__block_size",
    "lts__t_sector_hit_rate.pct",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    *(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS),
)
NCU_PLACES = ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu", "/usr/bin/ncu")


def find_ncu() -> str | None:
    """The ncu binary: on PATH, else the newest in the usual install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(path for pattern in NCU_PLACES for path in glob(pattern))
    return candidates[-1] if candidates else None


def run_cases(batches: list[int]) -> None:
    """Launch vLLM's kernel and ours LAUNCHES times per case (what ncu profiles)."""
    providers = load_providers()
    for batch in batches:
        for state_dtype in STATE_DTYPES.values():
            x = inputs(QWEN3_NEXT_DIMS, batch, state_dtype, seed=batch, device="cuda")
            arms = recurrent_arms(providers, x, GpuClock(QUICK))
            for name in ("vllm", "ours"):
                for _ in range(LAUNCHES):
                    arms[name]()
            torch.cuda.synchronize()
            print(f"profile_recurrent: ran B={batch} {state_dtype}", flush=True)


def number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_ncu_csv(text: str, batches: list[int]) -> list[dict]:
    """ncu's ``--csv --page raw`` rows, in launch order, grouped into the cases of ``run_cases``
    (per case: vLLM's LAUNCHES launches, then ours), medians per kernel and metric."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    rows = [r for r in rows if r.get("ID", "").isdigit()]  # the units row has no ID
    cases, per_case = [], 2 * LAUNCHES
    order = [(b, name) for b in batches for name in STATE_DTYPES]
    for index, (batch, dtype_name) in enumerate(order):
        launches = rows[index * per_case : (index + 1) * per_case]
        case = {"batch": batch, "state_dtype": dtype_name, "kernels": {}}
        for kernel, arm in KERNELS.items():
            mine = [r for r in launches if kernel in r["Kernel Name"]]
            case["kernels"][arm] = {
                "launches": len(mine),
                "kernel_name": mine[0]["Kernel Name"] if mine else None,
                **{
                    metric: statistics.median(number(r[metric]) for r in mine)
                    for metric in METRICS
                    if mine and metric in mine[0] and isinstance(number(mine[0][metric]), float)
                },
            }
        cases.append(case)
    return cases


TABLE_METRICS = (
    ("time (µs)", "gpu__time_duration.sum", 1e-3, ".1f"),
    ("DRAM % of peak", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1, ".1f"),
    ("DRAM MB read + written", None, None, ".1f"),
    ("instructions (M)", "smsp__inst_executed.sum", 1e-6, ".1f"),
    ("issue active %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1, ".1f"),
    ("warps active %", "sm__warps_active.avg.pct_of_peak_sustained_active", 1, ".1f"),
    ("registers", "launch__registers_per_thread", 1, ".0f"),
    ("threads per program", "launch__block_size", 1, ".0f"),
    *(
        (f"stall {s.replace('_', ' ')}", f"smsp__average_warps_issue_stalled_{s}_per_issue_active"
         ".ratio", 1, ".2f")
        for s in ("long_scoreboard", "short_scoreboard", "wait", "barrier", "not_selected")
    ),
)  # fmt: skip


def results_table(report: dict) -> str:
    """The Markdown table of a report: one row per metric, one column per case and kernel
    (stalls are warps stalled per issued instruction)."""
    columns = [
        (f"{STATE_NAMES[c['state_dtype']]} B={c['batch']} {arm}", c["kernels"][arm])
        for c in report["cases"]
        for arm in ("vllm", "ours")
    ]
    lines = [
        "| metric | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for label, metric, scale, spec in TABLE_METRICS:
        if metric is None:
            values = [
                (k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]) / 1e6 for _, k in columns
            ]
        else:
            values = [k[metric] * scale for _, k in columns]
        lines.append(f"| {label} | " + " | ".join(format(v, spec) for v in values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--batch-sizes", default="128,1024", help="comma-separated")
    parser.add_argument("--run", action="store_true", help="launch the kernels (under ncu)")
    parser.add_argument("--table", type=Path, help="print the Markdown table of this JSON file")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(results_table(json.loads(args.table.read_text())))
        return 0
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.run:
        run_cases(batches)
        return 0
    if args.out is None:
        parser.error("--out is required")
    report = {"schema": SCHEMA, "provenance": provenance(script="scripts/profile_recurrent.py")}
    ncu = find_ncu()
    if ncu is None:
        report["error"] = "ncu not found"
    else:
        command = [
            ncu, "--csv", "--page", "raw", "--metrics", ",".join(METRICS),
            "-k", "regex:" + "|".join(KERNELS),
            sys.executable, __file__, "--run", "--batch-sizes", args.batch_sizes,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        report["ncu"] = {"binary": ncu, "returncode": done.returncode}
        report["ncu"]["stderr_tail"] = done.stderr[-4000:]
        try:
            report["cases"] = parse_ncu_csv(done.stdout, batches)
        except (KeyError, ValueError) as error:
            report["error"] = f"could not read ncu's output: {error!r}"
            report["ncu"]["stdout_tail"] = done.stdout[-8000:]
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report.get("cases", report), indent=1)[:6000])
    return 0 if "cases" in report else 1


if __name__ == "__main__":
    sys.exit(main())
