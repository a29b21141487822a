"""An engine benchmark's timed workloads lined up with the GPU and CPU samples of its stage.

    python scripts/engine_round_samples.py OUT/bench_engine_golden_long.json \
        --gpu OUT/gpu_samples.csv --cpu OUT/gpu_samples_cpu.txt [--workload decode] [--json FILE]

prints one line per timed workload, in the order they ran: round, arm, seconds, tokens per
second, preempted requests, the GPU samples inside its window (count, utilization median and
minimum, the GPU's busy time they imply, lowest SM clock) and the host's CPU shares over it
(busy, steal). See gdn_evidence/e2e/round_samples.py.
"""

import argparse
import json
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.e2e.round_samples import read_cpu_samples, read_gpu_samples, round_samples

COLUMNS = (
    "round",
    "arm",
    "workload",
    "seconds",
    "output_tok_s",
    "preempted",
    "gpu_samples",
    "utilization_median",
    "utilization_min",
    "gpu_busy_s",
    "sm_mhz_min",
    "cpu_busy",
    "cpu_steal",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="bench_engine.py's JSON")
    parser.add_argument("--gpu", type=Path, required=True, help="the stage's nvidia-smi CSV")
    parser.add_argument("--cpu", type=Path, help="the stage's /proc/stat samples")
    parser.add_argument("--workload", help="only this workload (decode, itl, ...)")
    parser.add_argument(
        "--gpu-offset-s", type=float, default=0.0, help="added to nvidia-smi's timestamps"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    gpu = read_gpu_samples(args.gpu, args.gpu_offset_s)
    cpu = read_cpu_samples(args.cpu) if args.cpu else []
    rows = round_samples(report, gpu, cpu)
    if args.workload:
        rows = [r for r in rows if r["workload"] == args.workload]
    if not rows:
        print("no timed workload has started_at (a report from before it was recorded?)")
        return 1
    print(" ".join(f"{c:>12}" for c in COLUMNS))
    for row in rows:
        print(" ".join(f"{str(row.get(c, '-')):>12}" for c in COLUMNS))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
