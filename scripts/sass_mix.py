"""Instruction mix of the recurrent decode kernels, ours and vLLM's, compiled for sm_90 (no GPU).

    python scripts/sass_mix.py --out docs/evidence/sass_mix.json --vllm-release 0.34.0 \\
        --vllm-source RELEASE_TREE/vllm/third_party/flash_linear_attention/ops/fused_recurrent.py

(RELEASE_TREE: a release's extracted wheel, e.g. ~/.cache/vllm-gdn-invariant/releases/vllm-0.34.0.)

``--vllm-source`` defaults to the installed vLLM's ``fused_recurrent.py``. The arms and what the
counts mean: ``gdn_evidence/harness/sass_mix.py``. Prints the table of docs/kernels.md.
``--candidates`` counts instead the recurrent kernel at its default launch shape and at every
shape ``bench_decode.py --sweep`` times (B = 64, no vLLM arm), fewest instructions first.
``--pipelined`` counts the software-pipelined variants ``bench_decode.py --pipelined`` times
(``gdn_evidence/harness/pipelined_kernel.py``) beside ours (B = 128, no vLLM arm): registers,
shared memory and asynchronous copies (``harness/sass_mix.py``'s ``pipelined_counts``).
"""

import argparse
import json
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path

from gdn_evidence.harness.provenance import provenance
from gdn_evidence.harness.sass_mix import (
    candidate_counts,
    candidate_table,
    cases,
    installed_vllm_source,
    pipelined_counts,
    pipelined_table,
    table,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-source", type=Path, default=None)
    parser.add_argument("--vllm-release", default=None, help="label of --vllm-source's release")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--candidates", action="store_true", help="count the launch shapes the sweep times"
    )
    parser.add_argument(
        "--pipelined", action="store_true", help="count the pipelined variants the bench times"
    )
    args = parser.parse_args(argv)
    if args.candidates or args.pipelined:
        count, show = (
            (pipelined_counts, pipelined_table)
            if args.pipelined
            else (candidate_counts, candidate_table)
        )
        results = count(capability=args.capability)
        record = {
            "provenance": provenance(capability=args.capability, static=True),
            "cases": results,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(show(results))
        return 0
    source = args.vllm_source or installed_vllm_source()
    if not source.is_file():
        parser.error(f"--vllm-source {source} is not a file")
    batches = tuple(int(b) for b in args.batches.split(","))
    results = cases(source, batches, args.capability)
    record = {
        "provenance": provenance(
            vllm_source=str(source),
            vllm_release=args.vllm_release,
            capability=args.capability,
            static=True,
        ),
        "cases": results,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
