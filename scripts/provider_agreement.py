"""How far vLLM's GDN decode kernels are from the goldens, on CUDA, as JSON with provenance.

    python scripts/provider_agreement.py --out agreement.json

Needs CUDA and a vLLM (0.30.0 to 0.34.0) whose Triton kernels import. The cases (head layouts
tp1 and tp4, batch sizes, fp32 and bf16 state; golden recurrent_step and conv_update against
vLLM's packed-decode and causal_conv1d_update) and the report are those of
gdn_evidence/harness/agreement.py. The goldens run on the same GPU
(tests/gpu/test_golden_device_bitwise.py checks they equal their CPU bits).

Exit status: 0 when the report is written; 2 when CUDA or vLLM's kernels are not available
(nothing is measured or written).
"""

import argparse
import json
import sys
from pathlib import Path

import checkout  # noqa: F401 - this checkout first on sys.path
import torch

from gdn_evidence.harness.agreement import (
    BATCH_SIZES,
    build_report,
    load_providers,
)
from gdn_evidence.harness.layer import LAYOUTS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument(
        "--batch-sizes", default=",".join(map(str, BATCH_SIZES)), help="comma separated"
    )
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"from {sorted(LAYOUTS)}")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("provider_agreement: CUDA is not available; nothing measured", file=sys.stderr)
        return 2
    try:
        providers = load_providers()
    except (ImportError, AttributeError) as error:
        print(f"provider_agreement: vLLM's kernels are not available: {error}", file=sys.stderr)
        return 2
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    layouts = {name: LAYOUTS[name] for name in args.layouts.split(",")}
    report = build_report(providers, layouts, batch_sizes, args.seed, torch.device("cuda"))
    args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    print(f"provider_agreement: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
